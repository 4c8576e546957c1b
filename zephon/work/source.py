"""Work sources: the plan of which chunk each lane reads next, as a pure function of the recipe."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from zephon.io import Chunk, ChunkTable, Dataset
from zephon.io.remote import IOConfig
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
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an int, got {seed!r}")
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
        start, records, tokens = time.monotonic(), 0, 0
        size = int(table.sizes()[picks].sum())
        results = measure(i, [table.chunk(i, idx) for idx in picks])
        for j, (r, t) in enumerate(results, 1):
            records, tokens = records + r, tokens + t
            _progress(d.name, j, len(picks), start)
        units = tokens if self.token_estimation else records
        if units == 0:
            raise ValueError(
                f"dataset {d.name!r}: the {len(picks)} sampled chunks gave no {self.unit}; "
                "check the dataset and its filters"
            )
        rate = units / size
        log.info("zephon: %s has %.4f %s per %s", d.name, rate, self.unit, d.file_format().unit[:-1])
        return rate


def _progress(name: str, done: int, total: int, start: float) -> None:
    elapsed = time.monotonic() - start
    if done == total or done % 8 == 0:
        eta = elapsed / done * (total - done)
        log.info(
            "zephon: estimating %s: %d/%d sample chunks, %.1f chunks/s, ETA %.0fs",
            name,
            done,
            total,
            done / max(elapsed, 1e-9),
            eta,
        )


class DatasetWorkSource(StaticMixtureWorkSource):
    """One dataset, planned into lanes."""

    def __init__(self, dataset: Dataset, seed: int = 0):
        super().__init__([dataset], None, None, seed)


@dataclass(slots=True)
class Cursor:
    """Where a lane's source stands: chunks and units taken from each dataset. JSON-safe."""

    taken: list[int]
    used: list[float]

    def to_json(self) -> dict:
        return {"taken": list(self.taken), "used": list(self.used)}

    @staticmethod
    def from_json(data: dict, num_datasets: int) -> Cursor:
        taken, used = data["taken"], data["used"]
        if len(taken) != num_datasets or len(used) != num_datasets:
            raise ValueError(f"lane cursor {data} does not match {num_datasets} datasets")
        return Cursor([int(t) for t in taken], [float(u) for u in used])

    def copy(self) -> Cursor:
        return Cursor(list(self.taken), list(self.used))


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

    def start(self) -> Cursor:
        n = len(self.tables)
        return Cursor([0] * n, [0.0] * n)

    def chunks(self, lane: int, cursor: Cursor) -> Iterator[tuple[Chunk, Cursor]]:
        """The lane's chunks from ``cursor`` on, each with the cursor after it."""
        cursor = cursor.copy()
        shares = self.source.shares
        while True:
            d = pick(shares, cursor.used) if len(shares) > 1 else 0
            idx = self.dealers[d].chunk_index(lane, cursor.taken[d])
            if idx is None:
                return  # a dataset that stops when exhausted ends the lane's mixture
            chunk = self.tables[d].chunk(d, idx)
            cursor.taken[d] += 1
            cursor.used[d] += chunk.size * self.unit_rates[d]
            yield chunk, cursor.copy()
