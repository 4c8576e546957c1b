"""``python -m zephon.torchtitan.train --job.config_file train_configs/NAME.toml [--section.field v]``

TorchTitan's own training entry point, with zephon's job configs, data loader and CPU support.
Launch it with torchrun (see run_train.sh).
"""

from __future__ import annotations

import zephon.torchtitan  # noqa: F401 - CPU support must be in place before torchtitan loads


def main() -> None:
    import torchtitan.train

    from zephon.torchtitan.job import ZephonConfigManager

    torchtitan.train.ConfigManager = ZephonConfigManager  # main() builds ConfigManager()
    torchtitan.train.main()


if __name__ == "__main__":
    main()
