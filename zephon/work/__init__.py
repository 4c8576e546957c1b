"""Work sources: the pure plan of which chunk goes to which lane, and mixtures."""

from zephon.work.cursor import Cursor, Pending, Work
from zephon.work.source import (
    DatasetWorkSource,
    LanePlan,
    LaneSource,
    PlanContext,
    StaticMixtureWorkSource,
    TokenEstimation,
)

__all__ = [
    "Cursor",
    "DatasetWorkSource",
    "LanePlan",
    "LaneSource",
    "Pending",
    "PlanContext",
    "StaticMixtureWorkSource",
    "TokenEstimation",
    "Work",
]
