"""The runners' queue: most urgent work first, and work waited for before work read ahead; the
process runner's start."""

from __future__ import annotations

import os
import threading
import time

import pytest

from zephon.runners.process import ProcessExecutor
from zephon.runners.thread import ThreadExecutor
from zephon.testing.functions import SlowToStart


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


def test_until_a_worker_process_is_up_units_run_in_this_process():
    executor = ProcessExecutor(SlowToStart(), 2, timeout=600.0)
    try:
        first = executor.submit("a")
        second = executor.submit("b")  # the thread here is busy or done: either way it is served
        assert first.result(30) == ("a", os.getpid()), "the pool is still starting: run here"
        assert second.result(60)[0] == "b"
        deadline = time.monotonic() + 60
        while not executor.pool_up and time.monotonic() < deadline:
            time.sleep(0.05)
        unit, pid = executor.submit("c").result(60)
        assert unit == "c" and pid != os.getpid(), "once a worker is up, the work goes to the pool"
    finally:
        executor.shutdown()


def test_a_pool_slow_to_start_gets_the_work_after_the_timeout():
    executor = ProcessExecutor(SlowToStart(), 1, timeout=1.0)
    try:
        assert executor.submit("a").result(30) == ("a", os.getpid())
        time.sleep(1.2)  # past the timeout, the worker still starting: the pool's watchdog's turn
        unit, pid = executor.submit("b").result(60)
        assert unit == "b" and pid != os.getpid()
    finally:
        executor.shutdown()


@pytest.mark.parametrize("preset", [None, "true"])
def test_thread_workers_keep_hugging_face_tokenizers_to_one_thread_each(monkeypatch, preset):
    if preset is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", preset)
    executor = ThreadExecutor(lambda unit: unit, 2)
    try:
        assert executor.submit("a").result(10) == "a"
    finally:
        executor.shutdown()
    assert os.environ["TOKENIZERS_PARALLELISM"] == (preset or "false"), "the user's own setting stands"
