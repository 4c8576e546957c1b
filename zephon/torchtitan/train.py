"""``python -m zephon.torchtitan.train --job.config_file train_configs/NAME.toml [--section.field v]``

TorchTitan's own training entry point, with zephon's job configs, data loader and CPU support,
and the loader's per-dataset token counts in TorchTitan's metrics at every log step (each built
trainer's ``metrics_processor.log`` is wrapped by :func:`zephon.torchtitan.metrics.attach`).
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
    _report_data_metrics(torchtitan.train.Trainer)
    torchtitan.train.main()


def _report_data_metrics(trainer_class) -> None:
    """Every trainer built from now on reports the loader's data metrics (in this process only)."""
    from zephon.torchtitan import metrics

    init = trainer_class.__init__

    def init_and_attach(self, *args, **kwargs):
        init(self, *args, **kwargs)
        metrics.attach(self)

    trainer_class.__init__ = init_and_attach


if __name__ == "__main__":
    main()
