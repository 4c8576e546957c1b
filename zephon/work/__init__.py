"""Work sources: the datasets, their mixture, and the pure plan of which chunk each lane reads."""

from zephon.work.mixture import Mixer, MixState, Piece, Position
from zephon.work.source import (
    DatasetWorkSource,
    LanePlan,
    PlanContext,
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
    "StaticMixtureWorkSource",
    "TokenEstimation",
]
