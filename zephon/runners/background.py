"""Lanes driven ahead of their consumer by one background thread, through bounded queues.

One thread advances every lane of a rank, always the lane whose queue has room and whose next
batch the consumer will ask for first (the lowest next batch index, then the lowest lane), so the
work goes where delivery needs it, and a rank runs one such thread however many lanes it owns.
The stateless work (reading, tokenizing) runs on the runner's workers meanwhile.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

_END = object()


class _Raised:
    def __init__(self, error: BaseException):
        self.error = error


class LaneDriver:
    """``makers``: lane -> a function making that lane's iterator of items; ``index(item)``: the
    item's batch index; ``depth``: items a lane may hold ahead of its consumer; ``budget``: bytes
    (``size(item)``) all lanes together may hold, past which only a lane with nothing queued
    advances (the consumer may be waiting on it): image batches are a hundred times the bytes,
    and the work, of text ones."""

    def __init__(self, makers: dict[int, Callable[[], Iterator[Any]]], starts: dict[int, int],
                 index: Callable[[Any], int], depth: int, budget: int = 1 << 62,
                 size: Callable[[Any], int] = lambda item: 0):  # fmt: skip
        self.queues: dict[int, deque] = {lane: deque() for lane in makers}
        self.next_index = dict(starts)  # what each lane makes next
        self.index, self.depth = index, max(1, depth)
        self.budget, self.size, self.held = budget, size, 0
        self.changed = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, args=(makers,), name="zephon-lanes", daemon=True)
        self.thread.start()

    def _run(self, makers) -> None:
        iterators: dict[int, Iterator] = {}
        try:
            while True:
                with self.changed:
                    lane = self._next_lane()
                    while not self.stopped and lane is None:
                        self.changed.wait()
                        lane = self._next_lane()
                    if self.stopped:
                        return
                if lane not in iterators:
                    iterators[lane] = makers[lane]()
                try:
                    item = next(iterators[lane])
                except StopIteration:
                    item = _END
                except BaseException as e:  # raised in the consumer, where the lane's stream failed
                    item = _Raised(e)
                with self.changed:
                    self.queues[lane].append(item)
                    self.held += self.size(item) if _is_batch(item) else 0
                    self.next_index[lane] = None if not _is_batch(item) else self.index(item) + 1
                    self.changed.notify_all()
        finally:
            for iterator in iterators.values():
                getattr(iterator, "close", lambda: None)()

    def _next_lane(self) -> int | None:
        """The lane to advance: room in its queue, still going, needed soonest."""
        over = self.held >= self.budget
        ready = [
            lane
            for lane, queue in self.queues.items()
            if self.next_index[lane] is not None and len(queue) < self.depth and not (over and queue)
        ]
        return min(ready, key=lambda lane: (self.next_index[lane], lane), default=None)

    def next(self, lane: int) -> Any:
        """The lane's next item; StopIteration at its end, its error where it failed."""
        with self.changed:
            while not self.stopped and not self.queues[lane]:
                self.changed.wait()
            if self.stopped:
                raise StopIteration  # closed: nothing more comes, even if some was queued
            item = self.queues[lane][0]
            if _is_batch(item):
                self.queues[lane].popleft()
                self.held -= self.size(item)
                self.changed.notify_all()
        if item is _END:
            raise StopIteration  # stays at the head: the lane stays ended
        if isinstance(item, _Raised):
            raise item.error  # stays at the head: the lane stays failed
        return item

    def close(self) -> None:
        with self.changed:
            self.stopped = True
            self.changed.notify_all()


def _is_batch(item: Any) -> bool:
    return item is not _END and not isinstance(item, _Raised)
