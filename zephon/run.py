"""A run of a pipeline on one rank: its plan, its lanes' states, and the work that delivers them.

A :class:`Run` is what changes as batches are delivered; the recipe it runs is a
:class:`zephon.spec.RunSpec`, which a :class:`zephon.Pipeline` builds. ``state_dict()`` is what
was delivered, never what prefetch read ahead.

Iterating a run yields this rank's batches round-robin over its lanes, from where delivery
stopped: the start, a loaded checkpoint, or the last batch an earlier iteration delivered. A new
``iter()`` (or ``close()``) stops the background work of the previous iteration, whose iterator then
raises rather than end as if the data had: both never deliver the same batch, and no loop stops
early without a word.

An iterator holds its run, so a run is never finalized while anything iterates it (``for b in
make_pipeline()`` holds nothing else). A dropped run's background work is stopped by the reaper
thread (``zephon.runners.reaper``), never in a finalizer, which must not block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from zephon.batch import Batch
from zephon.digests import ChunkDigests
from zephon.fingerprint import check_restore
from zephon.lanes import ChunkStreams, Made, Pace, ReadAhead, lane_batches, say_if_not_compiled
from zephon.runners import LaneDriver, get_runner
from zephon.runners.reaper import close_when_dropped
from zephon.spec import RunSpec
from zephon.state import VERSION, LaneState, check_version
from zephon.work import LanePlan
from zephon.work.mixture import sum_counters


class Run:
    """One rank's run of ``spec``, from ``lanes`` (lane number -> state) or the start."""

    def __init__(self, spec: RunSpec, lanes: dict[int, LaneState] | None = None):
        self.spec = spec
        self._lanes = lanes
        self._loaded = lanes is not None
        self._plan: LanePlan | None = None
        self._delivery: _Delivery | None = None
        self._finalizer = None
        self._requests: list[list[int]] = []  # per dataset: requests and bytes of the chunks read

    @property
    def holds_state(self) -> bool:
        """Whether the run stands anywhere but at the start: a checkpoint was loaded or a batch
        was delivered."""
        return self._loaded or any(s.index for s in self.lane_states().values())

    def lane_states(self) -> dict[int, LaneState]:
        if self._lanes is None:
            n = len(self.spec.source.datasets)
            self._lanes = {lane: LaneState.start(n) for lane in self.spec.owned_lanes}
        return self._lanes

    # -- delivering -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        if self.spec.output != "batch":
            raise ValueError("end the pipeline with .batch(microbatch_size=...) to iterate it")
        self.close()
        if self._plan is None:
            self._plan = self.spec.lane_plan()
            self._digests = ChunkDigests([len(table) for table in self._plan.tables])
            self._requests = [[0, 0] for _ in self._plan.tables]
        delivery = _Delivery(self.spec, self._plan, self.lane_states(), self._digests, self._requests)
        self._delivery, self._finalizer = delivery, close_when_dropped(self, delivery.close)
        return _Iterator(self, delivery)

    def close(self) -> None:
        """Stops the background work; the state stays where delivery stopped. An iterator of
        this run raises from now on; ``iter()`` again continues from the state."""
        if self._delivery is not None:
            self._finalizer.detach()
            self._delivery.close()
            self._delivery = None

    # -- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """This rank's lanes: what has been delivered, as JSON-safe data (see zephon.state)."""
        return {
            "version": VERSION,
            "fingerprint": self.spec.fingerprint(),
            "lanes": {str(k): v.to_json() for k, v in sorted(self.lane_states().items())},
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: any state holding at least this rank's lanes, saved under
        the same recipe (runner, parallelism and dp_world_size may differ)."""
        check_version(state)
        spec, opts = self.spec, self.spec.options
        check_restore(state.get("fingerprint"), spec.fingerprint())
        strange = sorted(k for k in state["lanes"] if not (k.isdigit() and int(k) < opts.num_lanes))
        if strange:
            raise ValueError(
                f"the state holds lanes {strange} that a recipe of {opts.num_lanes} lanes does "
                "not have: it is not this recipe's state"
            )
        missing = [lane for lane in spec.owned_lanes if str(lane) not in state["lanes"]]
        if missing:
            raise ValueError(
                f"the state lacks lanes {missing} that rank {opts.dp_rank} of {opts.dp_world_size} "
                "owns; merge all ranks' states with zephon.merge_states before loading"
            )
        n = len(spec.source.datasets)
        lanes = {lane: LaneState.from_json(state["lanes"][str(lane)], n, lane) for lane in spec.owned_lanes}
        if spec.output == "batch":  # else it cannot be iterated: windows are not known yet
            lane_ops = spec.lane_ops()
            for lane, lane_state in lanes.items():
                lane_ops.check_start(lane, lane_state)
        self.close()
        self._lanes, self._loaded = lanes, True

    def stats(self) -> dict:
        """What this rank has delivered: tokens and documents begun per dataset, and counters
        (empty documents, filtered records), across restores; and what this process asked of
        the store per dataset (``io``: requests and bytes of planning, and of the chunks read)."""
        lanes = self.lane_states().values()
        names = self.spec.source.names
        tokens = [sum(s.tokens[i] for s in lanes) for i in range(len(names))]
        documents = [sum(s.documents[i] for s in lanes) for i in range(len(names))]
        read = self._requests or [[0, 0] for _ in names]
        io = {
            d.name: {"plan_requests": d.planning_requests.requests, "plan_bytes": d.planning_requests.bytes,
                     "read_requests": r[0], "read_bytes": r[1]}
            for d, r in zip(self.spec.source.datasets, read, strict=True)
        }  # fmt: skip
        return {
            "tokens": dict(zip(names, tokens, strict=True)),
            "documents": dict(zip(names, documents, strict=True)),
            "counters": sum_counters(s.counters for s in lanes),
            "batches": sum(s.index for s in lanes),
            "io": io,
        }


class _Delivery:
    """One iteration of a run: the workers, the lane streams, round-robin delivery."""

    def __init__(
        self,
        spec: RunSpec,
        plan: LanePlan,
        states: dict[int, LaneState],
        digests: ChunkDigests,
        requests: list,
    ):
        opts = spec.options
        say_if_not_compiled()
        self.names, self.runner = spec.source.names, get_runner(opts.runner)
        lane_ops = spec.lane_ops()
        work, parallelism = spec.chunk_work()
        self.executor = self.runner.executor(work, parallelism, opts.worker_timeout)
        # chunks read ahead per lane and dataset (zephon.lanes.ReadAhead); none inline, where
        # reading ahead only delays the batch at hand
        if self.runner.background:
            ahead = ReadAhead(len(states), len(self.names), parallelism, self.runner.units_ahead)
        else:
            ahead = ReadAhead.none()
        self.states = states
        self.closed = False
        makers, pace = {}, Pace(len(self.names))  # one pace for the run's lanes: they mix alike
        for lane in states:
            start = dataclasses.replace(states[lane])
            streams = ChunkStreams(
                plan,
                lane,
                self.executor,
                ahead,
                opts.worker_timeout,
                digests,
                rows_in=lane_ops.rows_in,
                pace=pace,
                io=opts.io,
            )
            streams.requests = requests  # one count per run, whichever lane read
            if self.runner.background:  # every lane's first chunks go to the workers at once
                streams.prime(start)
            makers[lane] = lambda lane=lane, start=start, streams=streams: lane_batches(
                plan, lane_ops, lane, start, streams
            )
        if self.runner.background:
            # a lane hands over a whole window and goes on with the next while that one is consumed
            ahead = lane_ops.window_rows // lane_ops.batch.microbatch_size + opts.prefetch
            starts = {lane: state.index for lane, state in states.items()}
            self.driver = LaneDriver(makers, starts, lambda made: made.batch.index, ahead,
                                     opts.prefetch_bytes, lambda made: made.batch.nbytes)  # fmt: skip
            self.streams = {lane: _Driven(self.driver, lane) for lane in states}
        else:
            self.driver = None
            self.streams = {lane: make() for lane, make in makers.items()}

    def __iter__(self) -> Iterator[Batch]:
        # Round-robin over the lanes, in the form that survives a restore mid-round: next is
        # the lane with the lowest (next index, lane number).
        active = set(self.streams)
        while active:
            lane = min(active, key=lambda lane: (self.states[lane].index, lane))
            if not self.closed:
                try:
                    made = next(self.streams[lane])
                except StopIteration:
                    if not self.closed:
                        active.remove(lane)
                        continue
            if self.closed:  # a closed delivery gives nothing more: a new one owns the state
                raise RuntimeError(
                    "this iterator's run was closed (close(), or a new iter() of the same pipeline or "
                    "run, which continues from where this one stopped): iterate that one instead"
                )
            self._delivered(made)
            yield made.batch
        self.close()  # every lane ended: the workers go now, not when the pipeline is dropped
        if not any(state.index for state in self.states.values()):
            raise ValueError(
                f"the pipeline ended without a batch: datasets {self.names} hold no usable records "
                "(blank lines? a filter that drops everything?)"
            )

    def _delivered(self, made: Made) -> None:
        batch, state = made.batch, self.states[made.batch.lane]
        state.window, state.delivered, state.index, state.mix = (
            made.window,
            made.delivered,
            batch.index + 1,
            made.mix,
        )
        state.digests = made.digests
        state.tokens = [t + c for t, c in zip(state.tokens, made.tokens, strict=True)]
        state.documents = [t + c for t, c in zip(state.documents, made.documents, strict=True)]
        state.counters = sum_counters([state.counters, batch.counters])

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.driver is not None:
            self.driver.close()
        for stream in self.streams.values():
            getattr(stream, "close", lambda: None)()
        self.executor.shutdown()


class _Iterator:
    """A run's batches, from one delivery. It holds the run, so that nothing finalizes a run
    while it is iterated."""

    def __init__(self, run: Run, delivery: _Delivery):
        self.run, self.batches = run, iter(delivery)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        return next(self.batches)


class _Driven:
    """One lane's stream, as the lane driver makes it."""

    def __init__(self, driver: LaneDriver, lane: int):
        self.driver, self.lane = driver, lane

    def __iter__(self):
        return self

    def __next__(self):
        return self.driver.next(self.lane)
