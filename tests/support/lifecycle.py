"""Runs made and dropped mid-iteration from several threads at once, with the garbage collector
run as often as it can be: what a run's life must survive without a deadlock."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable


def churn_runs(make: Callable[[int], object], rounds: int, threads: int = 3, bound: float = 200):
    """``threads`` threads, each making ``rounds`` runs of ``make(seed)`` and dropping them after
    3 to 6 batches, the collector's threshold at (50, 1, 1) meanwhile (so it runs inside pool
    submissions, planning's thread map, lane threads): (the threads still running after ``bound``
    seconds, the errors raised, the seconds taken)."""
    errors: list[BaseException] = []

    def churn(seed: int) -> None:
        try:
            for i in range(rounds):
                pipeline = make(seed * 100 + i)
                iterator = iter(pipeline)
                for _ in range(3 + i % 4):
                    next(iterator)
                del pipeline, iterator  # dropped with its background work running
                if i % 3 == 0:
                    gc.collect()
        except BaseException as e:
            errors.append(e)

    old = gc.get_threshold()
    gc.set_threshold(50, 1, 1)
    try:
        workers = [threading.Thread(target=churn, args=(s,), daemon=True) for s in range(threads)]
        start = time.monotonic()
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=max(0.0, bound - (time.monotonic() - start)))
        stuck = [t.name for t in workers if t.is_alive()]
    finally:
        gc.set_threshold(*old)
    return stuck, errors, time.monotonic() - start
