"""Work sources: the pure plan of which chunk goes to which lane, and mixtures."""

from zephon.work.source import (
    Cursor,
    DatasetWorkSource,
    LanePlan,
    PlanContext,
    StaticMixtureWorkSource,
    TokenEstimation,
)

__all__ = [
    "Cursor",
    "DatasetWorkSource",
    "LanePlan",
    "PlanContext",
    "StaticMixtureWorkSource",
    "TokenEstimation",
]
