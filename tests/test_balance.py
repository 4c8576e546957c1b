"""Attention cost balance: a window's rows in an order whose running cost tracks the mean."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from zephon import Dataset, Pipeline
from zephon.ops.balance import LOOKAHEAD, attention_cost, balanced_order
from zephon.testing import check_conformance, drain, run_job


def test_attention_cost_counts_the_causal_pairs_of_each_document_of_a_rows_inputs():
    positions = np.array(
        [
            [0, 1, 2, 0, 1, 0, 1, 2, 3],  # inputs: documents of 3, 2 and 3 tokens (the last is a label)
            [0, 1, 2, 3, 4, 5, 6, 7, 8],  # one document of 8
            [0, 0, 0, 0, 0, 0, 0, 0, 0],  # 8 documents of 1
        ],
        np.int32,
    )
    assert attention_cost(positions).tolist() == [6 + 3 + 6, 36, 8]


def _row_costs(n: int, seed: int) -> np.ndarray:
    """Rows of short documents, and a fifth of rows of long ones costing up to 800 times more."""
    rng = np.random.default_rng(seed)
    light, heavy = rng.integers(10_000, 1_000_000, n), rng.integers(2_000_000, 8_000_000, n)
    return np.where(rng.random(n) < 0.2, heavy, light).astype(np.int64)


@pytest.mark.parametrize("seed", range(5))
def test_any_run_of_consecutive_rows_costs_close_to_its_share_of_the_window(seed):
    costs = _row_costs(256, seed)
    order = balanced_order(costs)
    assert sorted(order.tolist()) == list(range(256))
    ordered, mean = costs[order], costs.mean()
    drift = np.cumsum(ordered) - mean * np.arange(1, 257)
    assert np.abs(drift).max() <= costs.max() - costs.min()
    for size, most in ((2, 0.95), (4, 0.7), (8, 0.5)):  # a step's rows of a lane, wherever it starts
        sums = np.convolve(ordered, np.ones(size, np.int64), "valid")
        before = np.convolve(costs, np.ones(size, np.int64), "valid")
        assert sums.max() < 0.8 * before.max()
        assert np.abs(sums - size * mean).mean() < most * np.abs(before - size * mean).mean()


def test_rows_leave_in_nearly_their_shuffled_order_so_no_step_gets_the_long_documents():
    costs = _row_costs(256, 9)
    order = balanced_order(costs).tolist()
    heavy = [i for i in range(256) if costs[i] * 256 > costs.sum()]
    light = [i for i in range(256) if i not in heavy]
    for queue in (heavy, light):
        emitted = [i for i in order if i in set(queue)]
        # each row leaves at most LOOKAHEAD - 1 places ahead of its turn in its queue
        assert all(queue.index(i) <= k + LOOKAHEAD - 1 for k, i in enumerate(emitted))
    first_half = sum(1 for i in order[:128] if i in heavy)
    assert abs(first_half - len(heavy) / 2) <= LOOKAHEAD


def _make(corpus, gpt2, world=1, rank=0, balance=True):
    ds = Dataset.from_path("synthetic", corpus, exhausted="repeat")
    return (
        Pipeline(ds)
        .options(num_lanes=4, chunk_bytes=4096, dp_rank=rank, dp_world_size=world)
        .tokenize(gpt2)
        .pack_flat(100)
        .shuffle(16, seed=1)
        .batch(microbatch_size=1, balance_attention=balance)
    )


def _window_rows(batches, pipeline) -> Counter:
    """(lane, window, row bytes): which rows each window of each lane holds, in any order."""
    ops, out = pipeline.spec().lane_ops(), Counter()
    for b in batches:
        window, start = 0, 0
        while start + ops.rows_in(window) <= b.index:
            start, window = start + ops.rows_in(window), window + 1
        out[(b.lane, window, b.tokens.tobytes(), b.positions.tobytes())] += 1
    return out


def test_balancing_reorders_each_windows_rows_and_evens_the_cost_of_a_step_across_ranks(corpus, gpt2):
    plain, balanced = _make(corpus, gpt2, balance=False), _make(corpus, gpt2)
    rows = 1 + 2 + 4 + 8 + 4 * 16  # whole windows of each lane: they double up to 16 rows
    a, b = drain(plain, 4 * rows), drain(balanced, 4 * rows)
    assert _window_rows(a, plain) == _window_rows(b, balanced)
    assert [x.digest() for x in a] != [x.digest() for x in b]

    def spread(batches):  # steps of 2 batches a lane, one lane a rank: slowest rank over the mean
        cost = {(x.lane, x.index // 2): 0 for x in batches}
        for x in batches:
            cost[(x.lane, x.index // 2)] += int(attention_cost(x.positions).sum())
        per_step = np.array([[cost[(lane, s)] for lane in range(4)] for s in range(8, rows // 2)])
        return (per_step.max(axis=1) / per_step.mean(axis=1)).mean()

    assert spread(b) < spread(a) - 0.02


def test_a_balanced_lane_is_elastic_restorable_and_its_setting_shapes_the_data(corpus, gpt2):
    def rank(world, r):
        return _make(corpus, gpt2, world, r)

    baseline, _ = run_job(rank, 1, 12, 2)
    assert run_job(rank, 4, 12, 2)[0] == baseline
    first, state = run_job(rank, 2, 5, 2)
    assert {**first, **run_job(rank, 4, 7, 2, state=state)[0]} == baseline
    check_conformance(lambda: rank(1, 0), steps=24, every=5)
    plain = _make(corpus, gpt2, balance=False)
    batch = next(op for op in plain.fingerprint()["operators"] if op["kind"] == "batch")
    assert sorted(batch) == ["kind", "microbatch_size"], "older checkpoints still load"
    with pytest.raises(ValueError, match="balance_attention"):
        plain.load_state_dict(rank(1, 0).state_dict())
