"""The fluent pipeline builder, its runs, and its checkpoint state.

A :class:`Pipeline` is an immutable recipe: a work source, options and operators. Iterating it
starts a run from the pipeline's current state (the start, or what ``load_state_dict`` gave it,
or where the last run stopped), yielding this rank's batches round-robin over its lanes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from zephon.batch import Batch
from zephon.io import Dataset
from zephon.lanes import ChunkWork, LaneOps, lane_batches
from zephon.ops import BatchRows, Filter, Map, Operator, PackFlat, Read, Shuffle, Tokenize
from zephon.ops.containers import sum_counters
from zephon.options import RENAMED, Options
from zephon.runners import Prefetcher, get_runner, thread_map
from zephon.state import VERSION, LaneState, check_version, diff
from zephon.work import DatasetWorkSource, LanePlan, PlanContext, StaticMixtureWorkSource

PLAN_VERSION = 2  # bump when the planning, mixing or packing algorithms change what a recipe yields
BEST_FIT_WINDOW_ROWS = 64  # best-fit packs a window at a time: enough rows to pack well


class Pipeline:
    """``Pipeline(source).options(...).tokenize(...).pack_flat(...).batch(...)``."""

    def __init__(self, source: StaticMixtureWorkSource | Dataset):
        if isinstance(source, Dataset):
            source = DatasetWorkSource(source)
        if not isinstance(source, StaticMixtureWorkSource):
            raise ValueError(f"Pipeline needs a work source or a Dataset, got {source!r}")
        self.source = source
        self._options = Options()
        self._ops: tuple[Operator, ...] = ()
        self._plan: LanePlan | None = None
        self._lanes: dict[int, LaneState] | None = None
        self._run: _Run | None = None

    # -- building ---------------------------------------------------------------------------

    def _with(self, **changes) -> Pipeline:
        new = Pipeline.__new__(Pipeline)
        new.__dict__.update(self.__dict__)
        new._plan, new._lanes, new._run = None, None, None
        new.__dict__.update(changes)
        return new

    def options(self, **options) -> Pipeline:
        for name in options:
            if name in RENAMED:
                raise ValueError(f"option {RENAMED[name]}")
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(Options)})
        if unknown:
            valid = sorted(f.name for f in dataclasses.fields(Options))
            raise ValueError(f"unknown option(s) {unknown}; valid options: {valid}")
        return self._with(_options=dataclasses.replace(self._options, **options))

    def _then(self, op: Operator) -> Pipeline:
        given = self._output()
        if given == "batch":
            raise ValueError(f"{op.kind} comes after batch; batch must be the last operator")
        if given not in op.takes:
            hint = " (documents are mixed in order; shuffle the packed rows)" if op.kind == "shuffle" else ""
            raise ValueError(
                f"{op.kind} takes {'/'.join(op.takes)}, but the pipeline gives {given} here{hint}"
            )
        return self._with(_ops=(*self._ops, op))

    def _output(self) -> str:
        kind = "records"
        for op in self._ops:
            kind = op.output(kind)
        return kind

    def map(self, fn: Callable[[dict], dict], parallelism: int | None = None) -> Pipeline:
        return self._then(Map(fn, parallelism))

    def filter(self, fn: Callable[[dict], bool], parallelism: int | None = None) -> Pipeline:
        return self._then(Filter(fn, parallelism))

    def tokenize(self, tokenizer_id: str, field: str = "text", parallelism: int | None = None,
                 add_bos: bool | None = None, add_eos: bool = True) -> Pipeline:  # fmt: skip
        return self._then(Tokenize(tokenizer_id, field, add_bos, add_eos, parallelism))

    def pack_flat(self, max_length: int, algorithm: str = "wrap") -> Pipeline:
        return self._then(PackFlat(max_length, algorithm, self._pad_id()))

    def shuffle(self, buffer_size: int, seed: int = 0) -> Pipeline:
        """Shuffles packed rows within each window (put it after ``pack_flat``)."""
        return self._then(Shuffle(buffer_size, seed))

    def batch(self, microbatch_size: int) -> Pipeline:
        return self._then(BatchRows(microbatch_size, self._pad_id()))

    def _pad_id(self) -> int:
        tok = next((op for op in self._ops if isinstance(op, Tokenize)), None)
        eos = tok.tokenizer().eos_id if tok else None
        return 0 if eos is None else eos

    # -- introspection ----------------------------------------------------------------------

    @property
    def opts(self) -> Options:
        return self._options

    @property
    def operators(self) -> tuple[Operator, ...]:
        return self._ops

    @property
    def dataset_names(self) -> list[str]:
        """Dataset names in index order: what ``Batch.sources`` values refer to."""
        return [d.name for d in self.source.datasets]

    @property
    def owned_lanes(self) -> list[int]:
        return self._options.owned_lanes()

    def fingerprint(self) -> dict:
        """Everything that shapes the data, readable, so that a mismatch can be named."""
        return {
            "plan_version": PLAN_VERSION,
            "source": self.source.fingerprint(self._options.io),
            "options": {**self._options.shaping(), "window_rows": self.window_rows()},
            "operators": [{"kind": op.kind, **op.params()} for op in self._ops],
        }

    # -- running ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        if self._output() != "batch":
            raise ValueError("end the pipeline with .batch(microbatch_size=...) to iterate it")
        self.close()
        self._run = _Run(self)
        return iter(self._run)

    def close(self) -> None:
        """Stops the current run's background work; the state stays where delivery stopped."""
        if self._run is not None:
            self._run.close()
            self._run = None

    def __del__(self):
        if getattr(self, "_run", None) is not None:
            self.close()

    def window_rows(self) -> int:
        """Rows per window: ``window_rows`` if given, else the shuffle buffer rounded up to whole
        microbatches (one microbatch without a shuffle, 64 rows for best-fit packing)."""
        batch = next((op for op in self._ops if isinstance(op, BatchRows)), None)
        size = batch.microbatch_size if batch else 1
        given = self._options.window_rows
        if given is not None:
            if given % size:
                raise ValueError(
                    f"option window_rows={given} is not a whole number of microbatches of {size} rows: "
                    f"use a multiple of {size}, or leave it unset"
                )
            return given
        shuffle = next((op for op in self._ops if isinstance(op, Shuffle)), None)
        pack = next((op for op in self._ops if isinstance(op, PackFlat)), None)
        rows = shuffle.buffer_size if shuffle else 1
        if pack is not None and pack.algorithm == "best_fit":
            rows = max(rows, BEST_FIT_WINDOW_ROWS)
        return -(-max(rows, size) // size) * size

    def _lane_ops(self) -> LaneOps:
        by_type = {type(op): op for op in self._ops}
        return LaneOps(by_type[PackFlat], by_type.get(Shuffle), by_type[BatchRows], self.window_rows())

    def _chunk_work(self) -> tuple[ChunkWork, int]:
        """The stateless operators fused into one function per chunk, and its parallelism."""
        read = Read(self.source.datasets, self._options.io, self._options.read_parallelism)
        ops = [read, *(op for op in self._ops if op.stateless)]
        return ChunkWork(ops, self.source.names), max(op.parallelism for op in ops)

    def _ensure_plan(self) -> LanePlan:
        if self._plan is None:
            ctx = PlanContext(
                num_lanes=self._options.num_lanes,
                chunk_size=self._options.chunk_size,
                chunk_bytes=self._options.chunk_bytes,
                io=self._options.io,
                map_fn=thread_map,
            )
            self._plan = self.source.plan(ctx)
        return self._plan

    def _lane_states(self) -> dict[int, LaneState]:
        if self._lanes is None:
            n = len(self.source.datasets)
            self._lanes = {lane: LaneState.start(n) for lane in self.owned_lanes}
        return self._lanes

    # -- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """This rank's lanes: what has been delivered, as JSON-safe data (see zephon.state)."""
        return {
            "version": VERSION,
            "fingerprint": self.fingerprint(),
            "lanes": {str(k): v.to_json() for k, v in sorted(self._lane_states().items())},
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: any state holding at least this rank's lanes, saved under
        the same recipe (runner, parallelism and dp_world_size may differ)."""
        check_version(state)
        changes = diff(state.get("fingerprint"), self.fingerprint())
        if changes:
            raise ValueError(
                "the checkpoint was made with a different recipe; changed: " + "; ".join(changes)
            )
        missing = [lane for lane in self.owned_lanes if str(lane) not in state["lanes"]]
        if missing:
            raise ValueError(
                f"the state lacks lanes {missing} that rank {self._options.dp_rank} of "
                f"{self._options.dp_world_size} owns; merge all ranks' states with "
                "zephon.merge_states before loading"
            )
        n = len(self.source.datasets)
        lanes = {lane: LaneState.from_json(state["lanes"][str(lane)], n) for lane in self.owned_lanes}
        self.close()
        self._lanes = lanes

    def stats(self) -> dict:
        """What this rank has delivered: tokens and documents begun per dataset, and counters
        (empty documents, filtered records), across restores."""
        lanes = self._lane_states().values()
        names = self.source.names
        tokens = [sum(s.tokens[i] for s in lanes) for i in range(len(names))]
        documents = [sum(s.documents[i] for s in lanes) for i in range(len(names))]
        return {
            "tokens": dict(zip(names, tokens, strict=True)),
            "documents": dict(zip(names, documents, strict=True)),
            "counters": sum_counters(s.counters for s in lanes),
            "batches": sum(s.index for s in lanes),
        }


class _Run:
    """One run of a pipeline on this rank: the workers, lane streams, round-robin delivery."""

    def __init__(self, pipeline: Pipeline):
        opts = pipeline.opts
        self.pipeline, self.runner = pipeline, get_runner(opts.runner)
        lane_ops = pipeline._lane_ops()
        self.plan = pipeline._ensure_plan()
        work, parallelism = pipeline._chunk_work()
        self.executor = self.runner.executor(work, parallelism)
        depth = max(1, -(-2 * parallelism // len(pipeline.owned_lanes)))
        self.states = pipeline._lane_states()
        self.closed = False
        self.streams: dict[int, Iterator] = {}
        for lane in pipeline.owned_lanes:
            start = dataclasses.replace(self.states[lane])

            def make(lane=lane, start=start):
                return lane_batches(self.plan, lane_ops, lane, start, self.executor, depth)

            if self.runner.background:
                self.streams[lane] = Prefetcher(make, opts.prefetch, name=f"zephon-lane-{lane}")
            else:
                self.streams[lane] = make()

    def __iter__(self) -> Iterator[Batch]:
        # Round-robin over the lanes, in the form that survives a restore mid-round: next is
        # the lane with the lowest (next index, lane number).
        active = set(self.streams)
        while active and not self.closed:  # a closed run delivers nothing more: a new run owns the state
            lane = min(active, key=lambda lane: (self.states[lane].index, lane))
            try:
                batch, window, delivered, mix = next(self.streams[lane])
            except StopIteration:
                active.remove(lane)
                continue
            self._delivered(batch, window, delivered, mix)
            yield batch
        if not self.closed and not any(state.index for state in self.states.values()):
            names = [d.name for d in self.pipeline.source.datasets]
            raise ValueError(
                f"the pipeline ended without a batch: datasets {names} hold no usable records "
                "(blank lines? a filter that drops everything?)"
            )

    def _delivered(self, batch: Batch, window: int, delivered: int, mix) -> None:
        state = self.states[batch.lane]
        state.window, state.delivered, state.index, state.mix = window, delivered, batch.index + 1, mix
        n = len(state.tokens)
        state.tokens = [t + int(c) for t, c in zip(state.tokens, batch.tokens_per_dataset(n), strict=True)]
        docs = batch.documents_per_dataset(n)
        state.documents = [t + int(c) for t, c in zip(state.documents, docs, strict=True)]
        state.counters = sum_counters([state.counters, batch.counters])

    def close(self) -> None:
        self.closed = True
        for stream in self.streams.values():
            getattr(stream, "close", lambda: None)()
        self.executor.shutdown()
