"""Most urgent work first: a queue of units ordered by ``priority``, and the executors around it.

Units wait in a heap ordered by ``priority`` (then submission order). A lane's chunks are
submitted with the window they are likely needed in (``zephon.lanes.ChunkStreams``), so the
consumer's next batches are made first: the first batch of a run waits for one lane's window, not
for every lane's. A queued unit may be given another priority (``reorder``: the lanes' pace, once
known, says which window a chunk read ahead is for), and a unit that is waited for while it still
queues (read ahead for later, needed now) moves to the front.

Two ways to drain it: worker threads that take the most urgent unit themselves
(:class:`WorkerThreads`, the thread runner: one hand-over per unit, from the lane to a worker),
and the process runner, which sends the most urgent units down the pipe of a worker process
with room (``zephon.runners.process``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from zephon.runners.base import Executor, held_longest, run_into

log = logging.getLogger(__name__)

_NOW = (-1,)  # before any priority a lane gives (windows count from 0)


class UrgentQueue:
    """Units by priority, each with the future of its result. ``ready`` guards it (and whatever
    its takers wait on besides: room in a pool)."""

    def __init__(self):
        self.heap: list = []  # [priority, order, unit, future]; unit None: moved
        self.entries: dict[Future, list] = {}  # the queued units' heap entries
        self.order = itertools.count()
        self.closed = False
        self.ready = threading.Condition()

    def put(self, unit: Any, priority: tuple) -> Future:
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
        self.reorder(future, _NOW)

    def reorder(self, future: Future, priority: tuple) -> None:
        """A queued unit's new priority (a hurried one stays at the front)."""
        with self.ready:
            entry = self.entries.get(future)
            if entry is None or entry[0] == _NOW or entry[0] == priority:
                return  # taken already, done, hurried, or no change
            moved = [priority, next(self.order), entry[2], future]
            entry[2] = None  # the old entry stays in the heap, empty, until it comes up
            heapq.heappush(self.heap, moved)
            self.entries[future] = moved
            self.ready.notify()

    def take(self, room: Callable[[], bool] = lambda: True) -> tuple[Any, Future] | None:
        """The most urgent unit and its future, set running, once there is one and ``room()``
        (called under ``ready``); None once closed."""
        with self.ready:
            while True:
                while not self.closed and (not self.heap or not room()):
                    self.ready.wait()
                if self.closed:
                    return None
                taken = self.pop()
                if taken is not None:
                    return taken

    def pop(self) -> tuple[Any, Future] | None:
        """The most urgent unit and its future, set running, or None if none waits; the caller
        holds ``ready``."""
        while self.heap:
            _, _, unit, future = heapq.heappop(self.heap)
            if unit is None:
                continue  # moved earlier
            del self.entries[future]
            if future.set_running_or_notify_cancel():
                return unit, future
            # cancelled while it waited: the next one
        return None

    def close(self) -> None:
        """Take no more units; those still queued are cancelled; takers get None."""
        with self.ready:
            self.closed = True
            waiting, self.heap = self.heap, []
            self.entries.clear()
            self.ready.notify_all()
        for *_, future in waiting:
            future.cancel()


class WorkerThreads(Executor):
    """``parallelism`` threads, each taking the most urgent unit from the queue, running the work
    on it and setting its future: no pool and no feeder in between, so a unit passes from the
    lane to a worker once. ``stuck`` answers from when a worker took the unit."""

    def __init__(self, work: Callable[[Any], Any], parallelism: int, name: str = "zephon-work"):
        self.work, self.queue = work, UrgentQueue()
        self.since: dict[int, tuple[float, Any]] = {}  # worker -> (when it took its unit, the unit)
        self.threads = [
            threading.Thread(target=self._serve, args=(k,), name=f"{name}-{k}", daemon=True)
            for k in range(max(1, parallelism))
        ]
        end_at_exit(self)
        for thread in self.threads:
            thread.start()

    def submit(self, unit: Any, priority: tuple = ()) -> Future:
        return self.queue.put(unit, priority)

    def hurry(self, future: Future) -> None:
        self.queue.hurry(future)

    def reorder(self, future: Future, priority: tuple) -> None:
        self.queue.reorder(future, priority)

    def _serve(self, k: int) -> None:
        while (taken := self.queue.take()) is not None:
            unit, future = taken
            self.since[k] = (time.monotonic(), unit)
            try:
                run_into(future, self.work, unit)
            finally:
                del self.since[k]
            del unit, future, taken  # hold nothing of a unit between units

    def stuck(self, timeout: float) -> Any | None:
        return held_longest(list(self.since.values()), timeout)

    def at_work(self) -> list[Any]:
        """The units its threads are running now."""
        return [unit for _, unit in list(self.since.values())]

    def shutdown(self) -> None:
        """Queued units are cancelled; a unit at work finishes, then its worker ends. Never waits."""
        self.queue.close()


# Threads that run units in this process are daemons, so that a process whose runs were never
# closed still exits; before the interpreter goes on to end, their executors are shut down and
# the threads joined (each ends its unit at work: the interpreter stops a daemon thread where it
# next takes the GIL, and stopping one inside a tokenizer's native code aborts the process,
# "FATAL: exception not rethrown", exit code -6).
_LIVE: weakref.WeakSet = weakref.WeakSet()


AT_EXIT = 5.0  # seconds the interpreter's exit waits, in all, for the units at work to end


def end_at_exit(executor: Any) -> None:
    """At the interpreter's exit, the ``queue`` (an ``UrgentQueue``) of ``executor`` is closed,
    so that its ``threads`` take no more units, and they are joined, up to ``AT_EXIT`` seconds for
    all executors together; units still at work then (``at_work()``) are named in the log. Only
    the queue: a process pool's own shutdown may wait for its receiver (after a worker died)."""
    _LIVE.add(executor)


def _close_all() -> None:
    executors = list(_LIVE)
    for executor in executors:
        executor.queue.close()
    deadline = time.monotonic() + AT_EXIT
    for executor in executors:
        for thread in executor.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    left = [unit for executor in executors for unit in executor.at_work()]
    if left:  # daemons: the interpreter ends them where they are
        log.warning(
            "zephon: at exit, %d unit(s) still at work in this process after %g s (the first: %r)",
            len(left), AT_EXIT, left[0],
        )  # fmt: skip


threading._register_atexit(_close_all)  # the hook concurrent.futures' own pools end by
