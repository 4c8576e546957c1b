"""Work sources: the datasets, their mixture, and the pure plan of which chunk each lane reads."""

from zephon.work.mixture import Mixer, MixState, Piece, Position
from zephon.work.schedule import Schedule
from zephon.work.source import (
    DatasetWorkSource,
    LanePlan,
    PlanContext,
    ScheduledMixtureWorkSource,
    StaticMixtureWorkSource,
    TokenEstimation,
)

__all__ = [
    "DatasetWorkSource",
    "LanePlan",
    "MixState",
    "Mixer",
    "Piece",
    "PlanContext",
    "Position",
    "Schedule",
    "ScheduledMixtureWorkSource",
    "StaticMixtureWorkSource",
    "TokenEstimation",
]
