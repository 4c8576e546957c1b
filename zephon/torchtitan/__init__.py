"""The TorchTitan adapter: zephon's data loader, TOML job configs and data recipes, CPU support.

The only part of zephon that imports torchtitan or reads torch.distributed and the environment.
Importing this package changes nothing in torch or TorchTitan: ``python -m zephon.torchtitan.train``
installs CPU support (``cpu.install``) explicitly, on machines without a GPU, before TorchTitan is
imported; on GPUs TorchTitan runs as it is. The names below are imported on first use.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Recipe": "zephon.torchtitan.recipe",
    "build_pipeline": "zephon.torchtitan.recipe",
    "load_recipe": "zephon.torchtitan.recipe",
    "ZephonDataLoader": "zephon.torchtitan.dataloader",
    "ZephonTokenizer": "zephon.torchtitan.tokenizer",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'zephon.torchtitan' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


__all__ = ["Recipe", "ZephonDataLoader", "ZephonTokenizer", "build_pipeline", "load_recipe"]
