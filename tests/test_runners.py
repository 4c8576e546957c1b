"""The runners' queue: most urgent work first, and work waited for before work read ahead."""

from __future__ import annotations

import threading

import pytest

from zephon.runners.thread import ThreadExecutor


@pytest.mark.parametrize("hurried", [None, "c", "a"])
def test_a_unit_waited_for_runs_before_everything_queued(hurried):
    ran, started, gate = [], threading.Event(), threading.Event()

    def work(unit):
        if unit == "first":
            started.set()
            gate.wait(10)
        ran.append(unit)
        return unit

    executor = ThreadExecutor(work, 1)  # one unit in the pool at a time: the rest queue
    try:
        futures = {"first": executor.submit("first", (0, 0))}
        assert started.wait(10)
        for unit, priority in (("a", (1, 0)), ("b", (1, 1)), ("c", (2, 0))):
            futures[unit] = executor.submit(unit, priority)
        executor.hurry(futures["first"])  # in the pool already: nothing to move
        if hurried:
            executor.hurry(futures[hurried])
            executor.hurry(futures[hurried])  # twice: still runs once
        gate.set()
        assert {u: f.result(10) for u, f in futures.items()} == {u: u for u in futures}
    finally:
        executor.shutdown()
    queued = ["a", "b", "c"]
    if hurried:
        queued.remove(hurried)
        queued.insert(0, hurried)
    assert ran == ["first", *queued]
