"""Zephon: an elastically deterministic data loader for LLM training.

Every optimizer step's global batch is bit-identical whatever the data-parallel size, runner or
worker count, across checkpoint/resume cycles onto other rank counts. See docs/DESIGN.md.
"""

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it from here)

from zephon.batch import Batch, batches_per_lane, global_step_digest
from zephon.io import Dataset
from zephon.options import Options
from zephon.pipeline import Pipeline
from zephon.run import Run
from zephon.state import merge_states
from zephon.work import (
    DatasetWorkSource,
    MixtureWorkSource,
    ScheduledMixtureWorkSource,
)

__all__ = [
    "Batch",
    "Dataset",
    "DatasetWorkSource",
    "MixtureWorkSource",
    "Options",
    "Pipeline",
    "Run",
    "ScheduledMixtureWorkSource",
    "__version__",
    "batches_per_lane",
    "global_step_digest",
    "merge_states",
]
