"""Lanes: one lane's stream of batches, made of flush windows, driven through the stages.

A lane's work source gives chunks; every ``flush_every`` chunks a :class:`Flush` marks the end of
a window. Each stage holds one accumulator per window, hands its work units to an executor, and
yields the results in submission order, so the output is the same whatever runs the work.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from zephon.batch import Batch
from zephon.errors import with_context
from zephon.io import Chunk
from zephon.ops import Operator
from zephon.ops.containers import sum_counters
from zephon.runners import Runner
from zephon.state import LaneState
from zephon.work import Cursor, LanePlan, Pending, Work


@dataclass(slots=True)
class Flush:
    """End of a window. ``window`` and ``cursor`` describe the window that starts after it."""

    window: int
    cursor: Cursor | None
    counters: dict[str, int] = field(default_factory=dict)


class Chain:
    """Consecutive stateless operators fused into one work function: one task per chunk."""

    def __init__(self, ops: list[Operator], dataset_names: list[str]):
        self.ops, self.names = ops, dataset_names

    def __call__(self, chunk: Chunk) -> Any:
        try:
            unit = chunk
            for op in self.ops:
                unit = op.work(unit)
            return unit
        except ValueError as e:
            name = self.names[chunk.dataset]
            where = f"dataset {name!r} (shard {chunk.shard}, [{chunk.start}, {chunk.stop}))"
            error = with_context(e, where)
            if error is e:
                raise
            raise error from e


class Measured:
    """A work function that also returns the units of its result: counted in the worker, so
    that what the source mixes by never depends on when a thread looks at the result."""

    def __init__(self, work, units):
        self.work, self.units = work, units

    def __call__(self, unit):
        result = self.work(unit)
        return result, self.units(result)


class Stage:
    """An operator (or a fused chain of stateless ones) with the executor that runs its work.

    The first stage takes :class:`Work` and reports each chunk's actual units (``units(result)``)
    back to the work source, which mixes by them.
    """

    def __init__(self, ops: list[Operator], runner: Runner, dataset_names: list[str], units=None):
        self.ops, self.measured = ops, units is not None
        self.stateless = ops[0].stateless
        self.work = Chain(ops, dataset_names) if self.stateless else ops[0].work
        if self.measured:
            self.work = Measured(self.work, units)  # results are (container, units)
        parallelism = max(op.parallelism for op in ops)
        self.executor = runner.executor(self.work, parallelism)
        self.lookahead = max(1, 2 * parallelism)

    @staticmethod
    def _report(pending: Pending, future) -> None:
        ok = not future.cancelled() and future.exception() is None
        pending.set(future.result()[1] if ok else 0)  # on failure the error surfaces in order

    def run(self, lane: int, window: int, upstream: Iterator) -> Iterator:
        op = self.ops[0]
        acc = op.accumulator(lane, window)
        inflight: deque = deque()  # (future or None, payload, counters to attach)
        pending: dict[str, int] = {}

        def submit(units):
            nonlocal pending
            for unit in units:
                if isinstance(unit, Work):
                    future = self.executor.submit(unit.chunk)
                    if unit.pending is not None:
                        future.add_done_callback(lambda f, p=unit.pending: Stage._report(p, f))
                else:
                    future = self.executor.submit(unit)
                inflight.append((future, None, pending))
                pending = {}

        for message in upstream:
            if isinstance(message, Flush):
                pending = sum_counters([pending, message.counters])
                submit(acc.flush())
                acc = op.accumulator(lane, message.window)
                inflight.append((None, Flush(message.window, message.cursor, pending), {}))
                pending = {}
            else:
                counters = getattr(message, "counters", None)
                if counters and not self.stateless:  # the accumulator consumes the container:
                    pending = sum_counters([pending, counters])  # its counters ride on
                submit(acc.push(message))
            while inflight and (len(inflight) > self.lookahead or _ready(inflight[0])):
                yield self._result(inflight.popleft())
        while inflight:
            yield self._result(inflight.popleft())

    def _result(self, entry):
        future, payload, counters = entry
        if future is None:
            return payload
        result = future.result()
        if self.measured:
            result = result[0]
        if counters:  # a new container: never mutate one another thread may be reading
            result = copy.copy(result)
            result.counters = sum_counters([result.counters, counters])
        return result


def _ready(entry) -> bool:
    return entry[0] is None or entry[0].done()


def window_messages(plan: LanePlan, lane: int, start: LaneState, flush_every: int) -> Iterator:
    """The lane's work from the start of ``start.window``, with a Flush after each window."""
    window, count, source = start.window, 0, plan.lane(lane, start.cursor)
    for work in source:
        yield work
        count += 1
        if count % flush_every == 0:
            window += 1
            yield Flush(window, source.cursor())
    if count % flush_every:
        yield Flush(window + 1, None)


def lane_batches(
    plan: LanePlan, stages: list[Stage], lane: int, start: LaneState, flush_every: int
) -> Iterator[tuple[Batch, int, int, Cursor]]:
    """The lane's batches from ``start`` on, each with ``(window, delivered, window cursor)``:
    where the lane stands once that batch is delivered.

    The first ``start.delivered`` batches of the window are replayed and dropped.
    """
    stream: Iterator = window_messages(plan, lane, start, flush_every)
    for stage in stages:
        stream = stage.run(lane, start.window, stream)
    window, cursor, position = start.window, start.cursor, 0
    first_index, carried, empty_windows = start.index - start.delivered, {}, 0
    for item in stream:
        if isinstance(item, Flush):
            empty_windows = empty_windows + 1 if position == 0 else 0
            _check_not_empty(plan, lane, empty_windows, flush_every)
            first_index += position
            window, cursor, position = item.window, item.cursor, 0
            carried = sum_counters([carried, item.counters])
            continue
        index = first_index + position
        position += 1
        if window == start.window and position <= start.delivered:
            continue  # delivered before the checkpoint
        batch = Batch(lane, index, item.tokens, item.positions, item.sources)
        batch.counters = sum_counters([carried, item.counters])
        carried = {}
        yield batch, window, position, cursor


def _check_not_empty(plan: LanePlan, lane: int, empty_windows: int, flush_every: int) -> None:
    """A window with any token gives a batch (its last row padded). Windows without one for two
    epochs of every dataset mean there is nothing to read: say so instead of spinning forever."""
    epoch = sum(-(-len(t) // plan.num_lanes) for t in plan.tables)  # this lane's chunks per epoch
    if empty_windows * flush_every > 2 * epoch + flush_every:
        names = [d.name for d in plan.source.datasets]
        raise ValueError(
            f"lane {lane} read {empty_windows * flush_every} chunks (two epochs of datasets {names}) "
            "without one token: the datasets hold no usable records (blank lines? a filter that "
            "drops everything? the wrong tokenize field?)"
        )
