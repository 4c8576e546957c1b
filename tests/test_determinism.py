"""Elastic determinism: the same global batches whatever the runner, workers or rank count."""

from __future__ import annotations

import pytest

from zephon.testing import drain, run_job

PER_LANE = 2  # batches each lane gives to one global step: global batch 8 lanes x 2 x 2 = 32
STEPS = 12


@pytest.fixture(scope="module")
def baseline(make_rank):
    digests, _ = run_job(lambda d, r: make_rank(d, r, runner="inline"), 1, STEPS, PER_LANE)
    return digests


@pytest.fixture(scope="module")
def inline_batches(make_rank):
    return [b.digest() for b in drain(make_rank(1, 0, runner="inline", parallelism=1), 60)]


@pytest.mark.parametrize(
    ("runner", "parallelism"),
    [
        ("inline", 4),
        ("thread", 1),
        ("thread", 2),
        ("thread", 4),
        ("process", 1),
        ("process", 2),
        ("process", 4),
    ],
)
def test_runner_and_parallelism_do_not_change_any_batch(make_rank, inline_batches, runner, parallelism):
    got = drain(make_rank(1, 0, runner=runner, parallelism=parallelism), 60)
    assert [b.digest() for b in got] == inline_batches


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_every_global_step_is_identical_on_1_2_4_and_8_ranks(make_rank, baseline, world):
    digests, _ = run_job(make_rank, world, STEPS, PER_LANE)
    assert digests == baseline


def test_step_digests_are_all_different_and_change_with_the_seed(make_rank, baseline):
    assert len(set(baseline.values())) == STEPS
    other, _ = run_job(lambda d, r: make_rank(d, r, seed=6), 1, STEPS, PER_LANE)
    assert other != baseline


@pytest.mark.parametrize(
    ("k", "before", "after"),
    [(3, 2, 4), (5, 4, 1), (7, 8, 2)],
    ids=["2-to-4-ranks", "4-to-1-ranks", "8-to-2-ranks"],
)
def test_resume_on_other_rank_count_matches_uninterrupted_run(make_rank, baseline, k, before, after):
    first, state = run_job(make_rank, before, k, PER_LANE)
    rest, _ = run_job(make_rank, after, STEPS - k, PER_LANE, state=state)
    assert {**first, **rest} == baseline


def _lane_state_after_each_batch(make_rank) -> dict[tuple[int, int], dict]:
    pipeline, states = make_rank(1, 0, runner="inline"), {}
    for _, batch in zip(range(STEPS * PER_LANE * 8), pipeline, strict=False):
        states[batch.lane, batch.index] = pipeline.state_dict()["lanes"][str(batch.lane)]
    pipeline.close()
    return states


def test_resume_exactly_at_a_window_edge(make_rank):
    states = _lane_state_after_each_batch(make_rank)
    assert len({s["window"] for s in states.values()}) >= 3, "the steps should cross several windows"
    # one batch per lane per step: every window's end is a step's end; a window's last batch
    # leaves the lane at the next window's start, nothing delivered of it
    edges = [k for k in range(2, STEPS) if states[0, k - 1]["delivered"] == 0]
    assert len(edges) >= 2, "some global steps end a window"
    baseline, _ = run_job(make_rank, 1, STEPS, 1)
    for k in edges[:2]:
        first, state = run_job(make_rank, 4, k, 1)
        assert all(lane["delivered"] == 0 and lane["index"] == k for lane in state["lanes"].values())
        rest, _ = run_job(make_rank, 2, STEPS - k, 1, state=state)
        assert {**first, **rest} == baseline


def test_second_resume_cycle_from_a_resumed_run_still_matches(make_rank, baseline):
    a, state = run_job(make_rank, 2, 3, PER_LANE)
    b, state = run_job(make_rank, 4, 4, PER_LANE, state=state)
    c, _ = run_job(make_rank, 1, STEPS - 7, PER_LANE, state=state)
    assert {**a, **b, **c} == baseline


def test_resume_with_another_runner_and_parallelism(make_rank, baseline):
    first, state = run_job(lambda d, r: make_rank(d, r, runner="inline", parallelism=1), 2, 5, PER_LANE)
    rest, _ = run_job(
        lambda d, r: make_rank(d, r, runner="thread", parallelism=4),
        4,
        STEPS - 5,
        PER_LANE,
        state=state,
    )
    assert {**first, **rest} == baseline
