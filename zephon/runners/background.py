"""Drive an iterator ahead of its consumer in a background thread, through a bounded queue."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

_END = object()


class _Raised:
    def __init__(self, error: BaseException):
        self.error = error


class Prefetcher:
    """Runs ``make()`` in a daemon thread and hands its items over, up to ``depth`` ahead.

    An error in the thread is raised in the consumer, at the point of the stream where it
    happened. ``close()`` stops the thread at its next hand-over.
    """

    def __init__(self, make: Callable[[], Iterator[Any]], depth: int, name: str):
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(make,), name=name, daemon=True)
        self.thread.start()

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, make) -> None:
        try:
            iterator = make()
            for item in iterator:
                if not self._put(item):
                    break
            else:
                self._put(_END)
            getattr(iterator, "close", lambda: None)()
        except BaseException as e:
            self._put(_Raised(e))

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            if self.stop.is_set():
                raise StopIteration  # closed: nothing more comes, even if some was queued
            try:
                item = self.queue.get(timeout=0.1)
                break
            except queue.Empty:
                continue
        if item is _END:
            self.queue.put(_END)  # stay exhausted
            raise StopIteration
        if isinstance(item, _Raised):
            self.queue.put(item)  # stay failed
            raise item.error
        return item

    def close(self) -> None:
        self.stop.set()
