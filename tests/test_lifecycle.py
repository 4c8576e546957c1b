"""A run's life: iterators hold their run, finalizers never block nor end an iteration, and an
iterator whose run was closed says so instead of ending as if the data had."""

from __future__ import annotations

import gc
import threading
import time

import pytest
from support.lifecycle import churn_runs

from zephon import Dataset, Pipeline
from zephon.run import _Delivery

RUNNERS = ["inline", "thread", "process"]


def _stopping(corpus: str, gpt2: str, runner: str):
    """An iterator of a pipeline that ends, and nothing else holds the pipeline."""
    ds = Dataset.from_path("synthetic", corpus, exhausted="stop")
    pipeline = (
        Pipeline(ds)
        .options(num_lanes=4, chunk_bytes=8192, runner=runner)
        .tokenize(gpt2, parallelism=2)
        .pack_flat(max_length=64)
        .shuffle(buffer_size=8, seed=3)
        .batch(microbatch_size=2)
    )
    return iter(pipeline)


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_pipeline_nobody_holds_gives_every_batch_through_garbage_collections(corpus, gpt2, runner):
    reference = [b.digest() for b in _stopping(corpus, gpt2, runner)]
    seen = []
    for i, batch in enumerate(_stopping(corpus, gpt2, runner)):  # nothing but the loop holds the pipeline
        if i in (10, 100, 400, 1000):  # a full collection takes a while in a big test session
            gc.collect()  # a run finalized here would end the loop early
        seen.append(batch.digest())
    assert len(reference) > 100
    assert seen == reference


def test_a_dropped_runs_work_is_stopped_on_the_reaper_thread_not_in_its_finalizer(make_rank, monkeypatch):
    closed_on = []
    close = _Delivery.close

    def recording(self):
        closed_on.append(threading.current_thread().name)
        close(self)

    monkeypatch.setattr(_Delivery, "close", recording)
    before = set(threading.enumerate())
    pipeline = make_rank(1, 0, runner="thread")
    next(iter(pipeline))
    del pipeline
    gc.collect()  # the pipeline and its run hold each other: only the collector frees them
    deadline = time.monotonic() + 10
    while not closed_on and time.monotonic() < deadline:
        time.sleep(0.01)
    # every run closed meanwhile (an earlier test's, dropped too, may be reaped now) on the reaper
    assert closed_on and set(closed_on) == {"zephon-reaper"}, closed_on
    deadline = time.monotonic() + 10
    while _run_threads(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _run_threads(before) == [], "the dropped run's threads ended"


def _run_threads(before: set[threading.Thread]) -> list[str]:
    """Threads of runs started since ``before`` (the reaper is the process's)."""
    return [
        t.name
        for t in set(threading.enumerate()) - before
        if t.name.startswith("zephon") and t.name != "zephon-reaper"
    ]


@pytest.mark.parametrize("runner", RUNNERS)
def test_an_iterator_of_a_closed_run_raises_instead_of_ending(make_rank, runner):
    pipeline = make_rank(1, 0, runner=runner)
    old = iter(pipeline)
    first = next(old)
    pipeline.close()
    with pytest.raises(RuntimeError, match="run was closed"):
        next(old)
    again = iter(pipeline)  # iterating again continues from the state
    assert (next(again).lane, first.lane) == (1, 0)
    pipeline.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("runner", RUNNERS)
def test_runs_dropped_and_collected_while_others_plan_and_iterate_never_deadlock(make_rank, runner):
    """Many runs dropped mid-iteration, with the collector run as often as it can be (inside
    pool submissions, planning's thread map, lane threads), while other threads plan and
    iterate: every iteration finishes, within a bound."""
    rounds = 4 if runner == "process" else 12
    stuck, errors, _ = churn_runs(lambda seed: make_rank(1, 0, runner=runner, seed=seed), rounds)
    assert not stuck, f"threads {stuck} did not finish in 200 s: a deadlock"
    assert not errors, errors
