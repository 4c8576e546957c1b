"""The TorchTitan adapter: zephon's data loader, TOML job configs and data recipes, CPU support.

The only part of zephon that imports torchtitan or reads torch.distributed and the environment.
Importing it first installs CPU support where there is no GPU (see ``cpu``), which must happen
before TorchTitan itself is imported.
"""

from zephon.torchtitan import cpu

cpu.install()

from zephon.torchtitan.dataloader import ZephonDataLoader  # noqa: E402
from zephon.torchtitan.recipe import Recipe, build_pipeline, load_recipe  # noqa: E402
from zephon.torchtitan.tokenizer import ZephonTokenizer  # noqa: E402

__all__ = ["Recipe", "ZephonDataLoader", "ZephonTokenizer", "build_pipeline", "load_recipe"]
