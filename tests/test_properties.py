"""Property test: any topology, any checkpoint step, any runner, the same global batches."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon.testing import run_job

STEPS = 6


def _divisors(n: int) -> list[int]:
    return [d for d in (1, 2, 3, 4, 6, 8) if n % d == 0]


@functools.cache
def _baseline(make_rank, lanes: int, window_rows: int | None, per_lane: int) -> dict:
    make = functools.partial(make_rank, runner="inline", num_lanes=lanes, window_rows=window_rows)
    return run_job(lambda d, r: make(d, r), 1, STEPS, per_lane)[0]


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_topology_checkpoint_and_runner_gives_the_uninterrupted_global_steps(make_rank, data):
    lanes = data.draw(st.sampled_from([1, 2, 3, 4, 6, 8]), label="num_lanes")
    before = data.draw(st.sampled_from(_divisors(lanes)), label="D")
    after = data.draw(st.sampled_from(_divisors(lanes)), label="D'")
    k = data.draw(st.integers(1, STEPS - 1), label="checkpoint step")
    window_rows = data.draw(st.sampled_from([None, 2, 4, 6, 16]), label="window_rows")
    per_lane = data.draw(st.integers(1, 3), label="batches per lane per step")
    runner = data.draw(st.sampled_from(["inline", "thread", "thread", "process"]), label="runner")
    parallelism = data.draw(st.integers(1, 4), label="parallelism")

    def make(d, r):
        return make_rank(
            d, r, runner=runner, parallelism=parallelism, num_lanes=lanes, window_rows=window_rows
        )

    first, state = run_job(make, before, k, per_lane)
    rest, _ = run_job(make, after, STEPS - k, per_lane, state=state)
    assert {**first, **rest} == _baseline(make_rank, lanes, window_rows, per_lane)
