"""``python -m zephon.torchtitan.train --job.config_file train_configs/NAME.toml [--section.field v]``

TorchTitan's own training entry point, with zephon's job configs, data loader and CPU support.
Launch it with torchrun (see run_train.sh).
"""

from __future__ import annotations

from zephon.torchtitan import cpu


def main() -> None:
    cpu.install_torch_compat()
    if cpu.on_cpu():
        cpu.install()  # before TorchTitan is imported: it picks its device type on import
    import torchtitan.train

    from zephon.torchtitan.job import ZephonConfigManager

    torchtitan.train.ConfigManager = ZephonConfigManager  # main() builds ConfigManager()
    torchtitan.train.main()


if __name__ == "__main__":
    main()
