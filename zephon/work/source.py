"""Work sources: the datasets of a pipeline, their mixture, and the plan of which chunk of each
dataset every lane reads, as a pure function of the recipe."""

from __future__ import annotations

from zephon.io import ChunkTable, Dataset
from zephon.work.mixture import UNITS, MixRule, normalize
from zephon.work.plan import ChunkDealer
from zephon.work.schedule import Schedule


class MixtureWorkSource:
    """Datasets mixed with fixed weights: ``mixture`` ({name: weight}, only ratios count; one
    dataset needs none), by ``unit``: ``"documents"`` (each dataset's share of the documents) or
    ``"tokens"`` (of the tokens, each document's exact count, its EOS/BOS included).

    Every lane mixes on its own, document by document, so every lane (and so every global batch)
    follows the mixture. A dataset with ``exhausted="stop"`` that runs out ends the lane;
    ``"repeat"`` starts its next epoch, a new seeded permutation of its chunks.
    """

    def __init__(
        self,
        datasets: list[Dataset],
        mixture: dict[str, float] | None = None,
        unit: str = "documents",
        seed: int = 0,
    ):
        if not datasets:
            raise ValueError("a work source needs at least one dataset")
        names = [d.name for d in datasets]
        if len(set(names)) != len(names):
            raise ValueError(f"dataset names must be unique, got {names}")
        if mixture is None:
            if len(datasets) > 1:
                raise ValueError(f"several datasets {names} need a mixture={{name: weight}}")
            mixture = {names[0]: 1.0}
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        if unit not in UNITS:
            raise ValueError(f"mixture unit {unit!r}: expected one of {UNITS}")
        self.datasets, self.seed, self.unit = list(datasets), seed, unit
        self.shares = normalize(mixture, names)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.datasets]

    def rule(self, num_lanes: int) -> MixRule:
        """What each of ``num_lanes`` lanes mixes by."""
        return MixRule(self.names, self.shares, self.unit)

    def lane_plan(self, tables: list[ChunkTable], num_lanes: int, chunking_given: bool) -> LanePlan:
        """Which chunk of each dataset (``tables``, one per dataset) every lane reads."""
        for d, t in zip(self.datasets, tables, strict=True):
            if d.exhausted == "stop" and len(t) < num_lanes:
                fix = (
                    "lower chunk_size/chunk_bytes (or leave them unset)"
                    if chunking_given
                    else "use fewer lanes"
                )
                raise ValueError(
                    f"dataset {d.name!r} has {len(t)} chunks for {num_lanes} lanes, so some lanes "
                    f'would get no data: {fix}, or set exhausted="repeat"'
                )
        return LanePlan(self, tables, num_lanes)


class ScheduledMixtureWorkSource(MixtureWorkSource):
    """Datasets mixed with weights that change over the run (``zephon.work.schedule``):

    ``schedule``: points ``{"at": units, "weights": {name: w}, "ramp": "step" | "linear"}``, the
    first at 0; ``at`` counts the run's delivered ``unit``: documents or tokens.
    The schedule is part of the recipe (the fingerprint), and follows from what each lane has
    taken, so it is the same on any DP size, runner and resume point.
    """

    def __init__(
        self,
        datasets: list[Dataset],
        schedule: list[dict],
        unit: str = "documents",
        seed: int = 0,
    ):
        names = [d.name for d in datasets]
        self.schedule = Schedule(schedule, names)
        super().__init__(datasets, dict.fromkeys(names, 1.0), unit, seed)
        self.shares = list(self.schedule.points[0].shares)  # where the run starts

    def rule(self, num_lanes: int) -> MixRule:
        return MixRule(self.names, self.shares, self.unit, self.schedule.for_lane(num_lanes))


class DatasetWorkSource(MixtureWorkSource):
    """One dataset, planned into lanes."""

    def __init__(self, dataset: Dataset, seed: int = 0):
        super().__init__([dataset], None, "documents", seed)


class LanePlan:
    """The plan, made once per run: every lane's chunk sequence of every dataset, on demand."""

    def __init__(self, source: MixtureWorkSource, tables: list[ChunkTable], num_lanes: int):
        self.source, self.tables, self.num_lanes = source, tables, num_lanes
        self.dealers = [
            ChunkDealer(d.name, len(t), source.seed, num_lanes, d.exhausted == "repeat")
            for d, t in zip(source.datasets, tables, strict=True)
        ]

    def chunk(self, dataset: int, lane: int, k: int):
        """The lane's ``k``-th chunk of ``dataset``, or None once a stopping dataset is used up."""
        index = self.dealers[dataset].chunk_index(lane, k)
        return None if index is None else self.tables[dataset].chunk(dataset, index)

    def chunks_per_lane_epoch(self, dataset: int) -> int:
        return -(-len(self.tables[dataset]) // self.num_lanes)
