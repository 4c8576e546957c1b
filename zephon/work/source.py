"""Work sources: the datasets of a pipeline, their mixture, and the plan of which chunk of each
dataset every lane reads, as a pure function of the recipe."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from zephon.io import ChunkTable, Dataset
from zephon.io.remote import IOConfig
from zephon.work.mixture import normalize
from zephon.work.plan import ChunkDealer
from zephon.work.schedule import Schedule


@dataclass(frozen=True, slots=True)
class TokenEstimation:
    """Mix by tokens: a dataset's share counts every token it delivers (its EOS/BOS included).

    Nothing is estimated any more: each lane mixes documents by their exact token counts after
    tokenization (see ``zephon.work.mixture``). The name stays for the API's sake.
    """


@dataclass(frozen=True, slots=True)
class PlanContext:
    """What a work source needs from the pipeline to make its plan. ``chunk_size`` and
    ``chunk_bytes``: None chooses them from each dataset's size and ``num_lanes``."""

    num_lanes: int
    chunk_size: int | None = None
    chunk_bytes: int | None = None
    io: IOConfig = field(default_factory=IOConfig)
    map_fn: Callable = map  # a parallel map for planning many remote files


class StaticMixtureWorkSource:
    """Datasets mixed with fixed weights, by records or, with ``token_estimation``, by tokens.

    Every lane mixes on its own, document by document, so every lane (and so every global batch)
    follows the mixture. A dataset with ``exhausted="stop"`` that runs out ends the lane;
    ``"repeat"`` starts its next epoch, a new seeded permutation of its chunks.
    """

    def __init__(
        self,
        datasets: list[Dataset],
        mixture: dict[str, float] | None = None,
        token_estimation: TokenEstimation | None = None,
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
        if token_estimation is not None and not isinstance(token_estimation, TokenEstimation):
            raise ValueError(
                f"token_estimation must be a TokenEstimation() or None, got {token_estimation!r}"
            )
        self.datasets, self.seed, self.token_estimation = list(datasets), seed, token_estimation
        self.shares = normalize(mixture, names)

    @property
    def unit(self) -> str:
        return "tokens" if self.token_estimation else "records"

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.datasets]

    def fingerprint(self, io: IOConfig | None = None) -> dict:
        """What shapes the data of the datasets and their mixture (see zephon.fingerprint)."""
        from zephon.fingerprint import of_source

        return of_source(self, io)

    def lane_schedule(self, num_lanes: int):
        """What each lane's mixer follows when the shares change over the run: None here."""
        return None

    def plan(self, ctx: PlanContext) -> LanePlan:
        tables = [
            d.chunks(ctx.num_lanes, ctx.chunk_size, ctx.chunk_bytes, ctx.io, ctx.map_fn)
            for d in self.datasets
        ]
        for d, t in zip(self.datasets, tables, strict=True):
            if d.exhausted == "stop" and len(t) < ctx.num_lanes:
                given = ctx.chunk_size is not None or ctx.chunk_bytes is not None
                fix = "lower chunk_size/chunk_bytes (or leave them unset)" if given else "use fewer lanes"
                raise ValueError(
                    f"dataset {d.name!r} has {len(t)} chunks for {ctx.num_lanes} lanes, so some lanes "
                    f'would get no data: {fix}, or set exhausted="repeat"'
                )
        return LanePlan(self, tables, ctx.num_lanes)


class ScheduledMixtureWorkSource(StaticMixtureWorkSource):
    """Datasets mixed with weights that change over the run (``zephon.work.schedule``):

    ``schedule``: points ``{"at": units, "weights": {name: w}, "ramp": "step" | "linear"}``, the
    first at 0; ``at`` counts the run's delivered tokens (with ``token_estimation``) or documents.
    The schedule is part of the recipe (the fingerprint), and follows from what each lane has
    taken, so it is the same on any DP size, runner and resume point.
    """

    def __init__(
        self,
        datasets: list[Dataset],
        schedule: list[dict],
        token_estimation: TokenEstimation | None = None,
        seed: int = 0,
    ):
        names = [d.name for d in datasets]
        self.schedule = Schedule(schedule, names)
        super().__init__(datasets, dict.fromkeys(names, 1.0), token_estimation, seed)
        self.shares = list(self.schedule.points[0].shares)  # where the run starts

    def lane_schedule(self, num_lanes: int):
        return self.schedule.for_lane(num_lanes)


class DatasetWorkSource(StaticMixtureWorkSource):
    """One dataset, planned into lanes."""

    def __init__(self, dataset: Dataset, seed: int = 0):
        super().__init__([dataset], None, None, seed)


class LanePlan:
    """The plan, made once per run: every lane's chunk sequence of every dataset, on demand."""

    def __init__(self, source: StaticMixtureWorkSource, tables: list[ChunkTable], num_lanes: int):
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
