"""Work sources: the datasets, their mixture, and the pure plan of which chunk each lane reads."""

from zephon.work.mixture import Mixer, MixRule, MixState, Piece, Position
from zephon.work.schedule import Schedule
from zephon.work.source import (
    DatasetWorkSource,
    LanePlan,
    MixtureWorkSource,
    ScheduledMixtureWorkSource,
)

__all__ = [
    "DatasetWorkSource",
    "LanePlan",
    "MixRule",
    "MixState",
    "Mixer",
    "MixtureWorkSource",
    "Piece",
    "Position",
    "Schedule",
    "ScheduledMixtureWorkSource",
]
