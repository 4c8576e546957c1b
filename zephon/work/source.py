"""Work sources: the plan of which chunk each lane reads next, as a pure function of the recipe."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from zephon.io import Chunk, ChunkTable, Dataset
from zephon.io.remote import IOConfig
from zephon.progress import Progress
from zephon.work.cursor import LAG, Cursor, Pending, Work
from zephon.work.mixture import normalize, pick
from zephon.work.plan import ChunkDealer, seed_sequence

log = logging.getLogger(__name__)

# measure(dataset index, chunks) -> for each chunk, in order, the (records, tokens) that the
# pipeline's record operators and tokenizer make of it
Measure = Callable[[int, list[Chunk]], Iterator[tuple[int, int]]]


@dataclass(frozen=True, slots=True)
class TokenEstimation:
    """Mix by tokens: measure each dataset's tokens per unit of chunk size on a seeded sample.

    ``sample_chunks`` chunks per dataset are drawn from across its whole plan (not its first
    rows) and run through the pipeline's record operators and tokenizer.
    """

    sample_chunks: int = 32

    def __post_init__(self):
        if not isinstance(self.sample_chunks, int) or self.sample_chunks < 1:
            raise ValueError(f"TokenEstimation(sample_chunks={self.sample_chunks!r}): must be >= 1")


@dataclass(frozen=True, slots=True)
class PlanContext:
    """What a work source needs from the pipeline to make its plan."""

    num_lanes: int
    chunk_size: int
    chunk_bytes: int
    measure: Measure
    records_exact: bool = True  # no filter: a row-format dataset's rows are its records
    rates: dict[str, float] | None = None  # measured units per chunk-size unit, from a checkpoint
    io: IOConfig = field(default_factory=IOConfig)
    map_fn: Callable = map  # a parallel map for planning many remote files


class StaticMixtureWorkSource:
    """Datasets mixed with fixed weights, by records or, with ``token_estimation``, by tokens.

    Every lane mixes on its own, so every lane (and so every global batch) follows the mixture.
    A dataset with ``exhausted="stop"`` that runs out ends the lane; ``"repeat"`` starts its next
    epoch, a new seeded permutation of its chunks.
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
        self.datasets, self.seed, self.token_estimation = list(datasets), seed, token_estimation
        self.shares = normalize(mixture, names)

    @property
    def unit(self) -> str:
        return "tokens" if self.token_estimation else "records"

    def fingerprint(self, io: IOConfig | None = None) -> dict:
        return {
            "datasets": {d.name: d.fingerprint(io) for d in self.datasets},
            "mixture": {d.name: s for d, s in zip(self.datasets, self.shares, strict=True)},
            "mixture_unit": self.unit,
            "mixture_lag": LAG if len(self.datasets) > 1 else 0,
            "token_estimation": self.token_estimation.sample_chunks if self.token_estimation else None,
            "seed": self.seed,
        }

    def plan(self, ctx: PlanContext) -> LanePlan:
        tables = [d.chunks(ctx.chunk_size, ctx.chunk_bytes, ctx.io, ctx.map_fn) for d in self.datasets]
        for d, t in zip(self.datasets, tables, strict=True):
            if d.exhausted == "stop" and len(t) < ctx.num_lanes:
                raise ValueError(
                    f"dataset {d.name!r} has {len(t)} chunks for {ctx.num_lanes} lanes, so some "
                    "lanes would get no data: lower chunk_size/chunk_bytes or num_lanes, or "
                    'set exhausted="repeat"'
                )
        rates = ctx.rates if ctx.rates is not None else self.measure_rates(tables, ctx)
        return LanePlan(self, tables, rates, ctx.num_lanes)

    def measure_rates(self, tables: list[ChunkTable], ctx: PlanContext) -> dict[str, float]:
        """Units (records or tokens) per unit of chunk size, for each dataset."""
        if len(self.datasets) == 1:
            return {self.datasets[0].name: 1.0}
        rates = {}
        for i, (d, table) in enumerate(zip(self.datasets, tables, strict=True)):
            exact = d.file_format(ctx.io).unit == "rows" and ctx.records_exact
            if exact and not self.token_estimation:
                rates[d.name] = 1.0  # a row is a record: nothing to measure
                continue
            rates[d.name] = self._measure_one(i, d, table, ctx.measure)
        return rates

    def _measure_one(self, i: int, d: Dataset, table: ChunkTable, measure: Measure) -> float:
        n = self.token_estimation.sample_chunks if self.token_estimation else 8
        rng = np.random.default_rng(seed_sequence(self.seed, d.name, "estimate"))
        picks = sorted(rng.choice(len(table), size=min(n, len(table)), replace=False).tolist())
        records, tokens = 0, 0
        size = int(table.sizes()[picks].sum())
        progress = Progress(f"measuring {self.unit} per byte of {d.name}", len(picks), "chunks")
        for r, t in measure(i, [table.chunk(i, idx) for idx in picks]):
            records, tokens = records + r, tokens + t
            progress.update()
        units = tokens if self.token_estimation else records
        if units == 0:
            raise ValueError(
                f"dataset {d.name!r}: the {len(picks)} sampled chunks gave no {self.unit}; "
                "check the dataset and its filters"
            )
        rate = units / size
        log.info("zephon: %s has %.4f %s per %s", d.name, rate, self.unit, d.file_format().unit[:-1])
        return rate


class DatasetWorkSource(StaticMixtureWorkSource):
    """One dataset, planned into lanes."""

    def __init__(self, dataset: Dataset, seed: int = 0):
        super().__init__([dataset], None, None, seed)


class LanePlan:
    """The plan, made once per pipeline start: every lane's chunk sequence on demand."""

    def __init__(self, source: StaticMixtureWorkSource, tables, rates: dict[str, float], num_lanes):
        self.source, self.tables, self.rates, self.num_lanes = source, tables, rates, num_lanes
        self.dealers = [
            ChunkDealer(d.name, len(t), source.seed, num_lanes, d.exhausted == "repeat")
            for d, t in zip(source.datasets, tables, strict=True)
        ]
        missing = [d.name for d in source.datasets if d.name not in rates]
        if missing or any(not math.isfinite(r) or r <= 0 for r in rates.values()):
            raise ValueError(f"bad measured rates {rates} for datasets {missing or ''}")
        self.unit_rates = [rates[d.name] for d in source.datasets]
        # the measured rate weighs as much as this much actual data of the lane
        self.prior_sizes = [PRIOR_CHUNKS * float(np.mean(t.stop - t.start)) for t in tables]

    def lane(self, lane: int, cursor: Cursor) -> LaneSource:
        """The lane's chunks from ``cursor`` on."""
        return LaneSource(self, lane, cursor)

    def size(self, dataset: int, index: int) -> int:
        table = self.tables[dataset]
        return int(table.stop[index] - table.start[index])


PRIOR_CHUNKS = 4


class LaneSource:
    """Iterates one lane's work: which dataset next (the mixture), which chunk of it (the
    dealer). ``cursor()`` is where it stands, for the checkpoint of a window start."""

    def __init__(self, plan: LanePlan, lane: int, cursor: Cursor):
        self.plan, self.lane = plan, lane
        self.taken, self.used, self.sizes = list(cursor.taken), list(cursor.used), list(cursor.sizes)
        self.recent: deque[Pending] = deque(cursor.recent)
        self.mixing = len(plan.source.shares) > 1
        self.recent_sizes: deque[int] = deque(self._sizes_of_recent())

    def _sizes_of_recent(self) -> list[int]:
        seen = [0] * len(self.taken)
        out = []
        for pending in reversed(self.recent):  # newest first: count back from `taken`
            d = pending.dataset
            seen[d] += 1
            out.append(
                self.plan.size(d, self.plan.dealers[d].chunk_index(self.lane, self.taken[d] - seen[d]))
            )
        return out[::-1]

    def __iter__(self) -> LaneSource:
        return self

    def __next__(self) -> Work:
        d = self._pick()
        idx = self.plan.dealers[d].chunk_index(self.lane, self.taken[d])
        if idx is None:
            raise StopIteration  # a dataset that stops when exhausted ends the lane's mixture
        self.taken[d] += 1
        pending = None
        if self.mixing:
            pending = Pending(d)
            self.recent.append(pending)
            self.recent_sizes.append(self.plan.size(d, idx))
            if len(self.recent) > LAG:
                old, size = self.recent.popleft(), self.recent_sizes.popleft()
                self.used[old.dataset] += old.wait()  # waits for that chunk's work if need be
                self.sizes[old.dataset] += size
        return Work(self.plan.tables[d].chunk(d, idx), pending)

    def rate(self, d: int) -> float:
        """Units per unit of size of dataset ``d``: measured, then what the lane has seen."""
        prior = self.plan.prior_sizes[d]
        return (self.used[d] + self.plan.unit_rates[d] * prior) / (self.sizes[d] + prior)

    def _pick(self) -> int:
        if not self.mixing:
            return 0
        rates = [self.rate(d) for d in range(len(self.taken))]
        decision = [float(u) for u in self.used]
        for pending, size in zip(self.recent, self.recent_sizes, strict=True):
            decision[pending.dataset] += size * rates[pending.dataset]
        upcoming = []
        for d, dealer in enumerate(self.plan.dealers):
            idx = dealer.chunk_index(self.lane, self.taken[d])
            upcoming.append(0.0 if idx is None else self.plan.size(d, idx) * rates[d])
        return pick(self.plan.source.shares, decision, upcoming)

    def cursor(self) -> Cursor:
        return Cursor(list(self.taken), list(self.used), list(self.sizes), list(self.recent))
