"""Most urgent work first: a gate in front of a pool that hands it a few units at a time.

Units wait in a heap ordered by ``priority`` (then submission order); a feeder thread hands the
pool the most urgent one whenever fewer than ``limit`` are in the pool. A lane's chunks are
submitted with the window they are needed for, so the consumer's next batches are made first:
the first batch of a run waits for one lane's window, not for every lane's. A unit that is
waited for while it still queues (read ahead for later, needed now) moves to the front.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from zephon.runners.base import Executor

_NOW = (-1,)  # before any priority a lane gives (windows count from 0)


class PriorityGate(Executor):
    def __init__(self, pool_submit: Callable[[Any], Future], limit: int, on_shutdown: Callable[[], None]):
        self.pool_submit, self.limit, self.on_shutdown = pool_submit, max(1, limit), on_shutdown
        self.heap: list = []  # [priority, order, unit, future]; unit None: moved to the front
        self.entries: dict[Future, list] = {}  # the queued units' heap entries
        self.order = itertools.count()
        self.in_pool, self.closed = 0, False
        self.ready = threading.Condition()
        self.feeder = threading.Thread(target=self._feed, name="zephon-feeder", daemon=True)
        self.feeder.start()

    def submit(self, unit: Any, priority: tuple = ()) -> Future:
        future: Future = Future()
        with self.ready:
            if self.closed:
                future.cancel()
                return future
            entry = [priority, next(self.order), unit, future]
            heapq.heappush(self.heap, entry)
            self.entries[future] = entry
            self.ready.notify()
        return future

    def hurry(self, future: Future) -> None:
        with self.ready:
            entry = self.entries.get(future)
            if entry is None or entry[0] == _NOW:
                return  # in the pool already, done, or hurried
            moved = [_NOW, next(self.order), entry[2], future]
            entry[2] = None  # the old entry stays in the heap, empty, until it comes up
            heapq.heappush(self.heap, moved)
            self.entries[future] = moved
            self.ready.notify()

    def _feed(self) -> None:
        while True:
            with self.ready:
                while not self.closed and (not self.heap or self.in_pool >= self.limit):
                    self.ready.wait()
                if self.closed:
                    return
                _, _, unit, future = heapq.heappop(self.heap)
                if unit is None:
                    continue  # moved to the front earlier
                del self.entries[future]
                if not future.set_running_or_notify_cancel():
                    continue  # cancelled while it waited
                self.in_pool += 1
            try:
                inner = self.pool_submit(unit)
            except BaseException as e:  # a pool that cannot take work: the error goes to its unit
                self._finish(None, future, e)
                continue
            inner.add_done_callback(lambda done, out=future: self._finish(done, out))

    def _finish(self, done: Future | None, out: Future, error: BaseException | None = None) -> None:
        with self.ready:
            self.in_pool -= 1
            self.ready.notify()
        if error is None and done.cancelled():
            error = RuntimeError("the worker pool was shut down")
        elif error is None:
            error = done.exception()
        if error is None:
            out.set_result(done.result())
        else:
            out.set_exception(error)

    def shutdown(self) -> None:
        with self.ready:
            self.closed = True
            waiting, self.heap = self.heap, []
            self.entries.clear()
            self.ready.notify_all()
        for *_, future in waiting:
            future.cancel()
        self.on_shutdown()
