"""Runners: where stateless work runs. Results are futures; order is restored by the caller."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any


class Executor(ABC):
    """Runs one work function on units; ``submit`` returns a future of its result."""

    @abstractmethod
    def submit(self, unit: Any, priority: tuple = ()) -> Future:
        """``priority``: lower runs sooner, where the executor has a queue (ties: first come)."""

    def hurry(self, future: Future) -> None:  # noqa: B027 - no queue by default
        """``future`` is waited for now: run it before anything queued, where it still waits."""

    def reorder(self, future: Future, priority: tuple) -> None:  # noqa: B027 - no queue by default
        """``future``, still queued, now has ``priority`` (not once hurried)."""

    def stuck(self, timeout: float) -> Any | None:
        """A unit the workers have held for more than ``timeout`` seconds (the longest held), or
        None: the watchdog of stuck workers asks. Nothing is held where work runs at once."""
        return None

    def shutdown(self) -> None:  # noqa: B027 - nothing to release by default
        pass


def run_into(future: Future, work: Callable[[Any], Any], unit: Any) -> None:
    """``work(unit)``'s result into ``future``, or its error (delivered with the unit, in order,
    wherever the work ran)."""
    try:
        result = work(unit)
    except BaseException as e:
        future.set_exception(e)
    else:
        future.set_result(result)


def held_longest(held: Iterable[tuple[float, Any]], timeout: float) -> Any | None:
    """Of units held since when (``(monotonic time, unit)`` pairs), the one held longest, if that
    is over ``timeout`` seconds (the watchdog of stuck workers asks); else None."""
    oldest = min(held, key=lambda h: h[0], default=None)
    return oldest[1] if oldest is not None and time.monotonic() - oldest[0] > timeout else None


class InlineExecutor(Executor):
    """Runs the work at once, in the calling thread."""

    def __init__(self, work: Callable[[Any], Any]):
        self.work = work

    def submit(self, unit: Any, priority: tuple = ()) -> Future:
        future: Future = Future()
        run_into(future, self.work, unit)
        return future


class Runner(ABC):
    """Makes executors for work functions; ``parallelism`` 0 means the caller's own thread."""

    name: str
    background: bool  # whether lanes are driven ahead of the consumer in background threads
    # units per worker that a lane keeps asked for, across its datasets (zephon.lanes.ReadAhead)
    units_ahead: int = 4

    @abstractmethod
    def executor(self, work: Callable[[Any], Any], parallelism: int, timeout: float) -> Executor:
        """``timeout``: the seconds a worker may take (the option ``worker_timeout``)."""

    def warm_up(self, work: Callable[[Any], Any]) -> None:  # noqa: B027 - nothing to start by default
        """Start now what the workers of ``work`` start from, where they start from something
        slow to make (``zephon.pipeline.Pipeline.warm_up``); threads start in microseconds."""
