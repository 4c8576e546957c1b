"""Scheduled mixtures: the schedule's arithmetic by hand, the mixer under it, real text, elasticity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zephon import Dataset, Pipeline, ScheduledMixtureWorkSource
from zephon.testing import kjv_path, run_job, write_jsonl
from zephon.testing.data import python_source_documents
from zephon.work import Mixer, MixRule, MixState, Schedule

# -- the schedule ---------------------------------------------------------------------------------

STEP_THEN_RAMP = [
    {"at": 0, "weights": {"a": 0.7, "b": 0.3}},
    {"at": 1000, "weights": {"a": 0.3, "b": 0.7}},  # a step at 1000
    {"at": 2000, "weights": {"a": 0, "b": 1}, "ramp": "linear"},  # a ramp over [1000, 2000)
]


def test_targets_are_the_integral_of_the_weights_and_due_inverts_them():
    lane = Schedule(STEP_THEN_RAMP, ["a", "b"]).for_lane(1)
    assert lane.weights(500) == [0.7, 0.3] and lane.weights(1500) == pytest.approx([0.15, 0.85])
    # by hand: 0.7 * 1000 = 700; then a's weight falls 0.3 -> 0 over 1000: + 1000 * 0.15 = 150
    assert lane.target(0, 1000) == pytest.approx(700) and lane.target(0, 2000) == pytest.approx(850)
    assert lane.target(0, 1500) == pytest.approx(700 + 500 * 0.3 - 0.3 / 1000 * 500**2 / 2)  # 812.5
    assert lane.target(1, 3000) == pytest.approx(300 + 1000 * (0.7 + 1) / 2 + 1000)  # 2150
    for d in (0, 1):
        for x in (1, 350, 999, 1000, 1234.5, 1999):
            assert lane.due(d, lane.target(d, x)) == pytest.approx(x)
    assert lane.due(0, 850) == pytest.approx(2000) and lane.due(0, 851) == math.inf  # a gets no more


def test_a_lane_follows_the_run_schedule_scaled_by_the_number_of_lanes():
    schedule = Schedule(STEP_THEN_RAMP, ["a", "b"])
    assert schedule.for_lane(4).weights(250) == [0.3, 0.7]  # the run is at 1000 when a lane is at 250
    assert schedule.for_lane(4).target(0, 250) == pytest.approx(700 / 4)


ONE = [{"at": 0, "weights": {"a": 1, "b": 1}}]


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([], "non-empty list"),
        ([{"at": 5, "weights": {"a": 1, "b": 1}}], "point 1: the first point is at 0"),
        ([{"at": 0, "weights": {"a": 1, "b": 1}, "ramp": "linear"}], "point 1: .*does not ramp"),
        ([{"at": 0, "weights": {"a": 1, "b": 2}}, {"at": 0, "weights": {"a": 1, "b": 1}}], "point 2: at = 0"),
        ([{"at": 0, "weights": {"a": 1}}], r"point 1: mixture gives no weight for dataset\(s\) \['b'\]"),
        ([{"at": 0, "weights": {"a": 0, "b": 0}}], "point 1: mixture weights .* are all 0"),
        ([{"at": 0, "weights": {"a": -1, "b": 1}}], "weight for 'a' must be a number >= 0"),
        ([{"at": 0, "weights": {"a": 1, "b": 1}, "ramp": "cubic"}], "ramp = 'cubic', expected one of"),
        ([{"at": 0.5, "weights": {"a": 1, "b": 1}}], r"at = 0\.5 should be a whole number"),
        ([{"at": 0, "wieghts": {"a": 1, "b": 1}}], "point 1: expected"),
        ([*ONE, {"at": math.inf, "weights": {"a": 1, "b": 1}}], "point 2: at = inf should be a whole number"),
        ([*ONE, {"at": math.nan, "weights": {"a": 1, "b": 1}}], "point 2: at = nan should be a whole number"),
        ([*ONE, {"at": 10**400, "weights": {"a": 1, "b": 1}}], "point 2: at = 1000+ should be a whole"),
        ([{"at": 0, "weights": {"a": 1e308, "b": 1e308}}],
         r"point 1: mixture weights .* sum to more than the largest float .*: scale them all down"),
        ([*ONE, {"at": 9, "weights": {"a": math.nan, "b": 1}}],
         "point 2: mixture weight for 'a' must be a number >= 0, got nan: give finite weights"),
        ([{"at": 0, "weights": {"a": 0, "b": 1e-320}}], "'b' is 1e-320, under the smallest normal float"),
        ([{"at": 0, "weights": {"a": 1e-300, "b": 1e300}}], r"'a' \(1e-300\) is too small .*, or give it 0"),
    ],
)  # fmt: skip
def test_bad_schedules_are_explained(points, message):
    with pytest.raises(ValueError, match=message):
        Schedule(points, ["a", "b"])


# -- the mixer under a schedule ---------------------------------------------------------------


def _stream(dataset: int, lengths: list[int]):
    from zephon.ops.containers import Docs

    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.zeros(int(offsets[-1]), np.int32)
    return Docs(tokens, offsets, np.arange(len(lengths), dtype=np.int64), dataset, {})


def _mixer(lengths: list[list[int]], shares, schedule=None) -> Mixer:
    chunks = [_stream(d, ls) for d, ls in enumerate(lengths)]

    def fetch(d, k, skip):
        return chunks[d] if k == 0 else None

    names = [f"d{i}" for i in range(len(lengths))]
    return Mixer(
        MixRule(names, shares, "tokens", schedule), fetch, MixState.start(len(lengths)), [5] * len(lengths)
    )


def test_a_schedule_that_never_changes_takes_what_fixed_shares_take():
    rng = np.random.default_rng(0)
    lengths = [
        list(rng.integers(1, 300, 400)),
        list(rng.integers(1, 40, 3000)),
        list(rng.integers(50, 90, 800)),
    ]
    fixed = _mixer(lengths, [0.5, 0.3, 0.2])
    flat = Schedule([{"at": 0, "weights": {"d0": 5, "d1": 3, "d2": 2}}], ["d0", "d1", "d2"])
    scheduled = _mixer(lengths, [0.5, 0.3, 0.2], flat.for_lane(1))
    for _ in range(2000):
        a, b = fixed.take(64), scheduled.take(64)
        assert (a.dataset, a.start, a.stop) == (b.dataset, b.start, b.stop)


def test_every_take_keeps_each_dataset_within_one_piece_of_its_scheduled_target():
    rng = np.random.default_rng(1)
    lengths = [list(rng.integers(1, 500, 3000)), list(rng.integers(1, 30, 30000))]
    schedule = Schedule(
        [{"at": 0, "weights": {"d0": 0.9, "d1": 0.1}}, {"at": 20000, "weights": {"d0": 0.1, "d1": 0.9}},
         {"at": 50000, "weights": {"d0": 0.6, "d1": 0.4}, "ramp": "linear"}],
        ["d0", "d1"],
    ).for_lane(1)  # fmt: skip
    mixer, total, worst = _mixer(lengths, [0.9, 0.1], schedule), 0, 0.0
    while total < 80000:
        total += len(mixer.take(128))
        for d in (0, 1):
            worst = max(worst, abs(mixer.used[d] - schedule.target(d, total)))
    assert worst <= 128  # one piece: at most the limit asked for


# -- real text ----------------------------------------------------------------------------------


def _real(scale: int) -> list[dict]:
    """In the run's delivered tokens (all lanes): a step at 2 x scale, a ramp from 4 to 6 x scale."""
    return [
        {"at": 0, "weights": {"bible": 0.8, "code": 0.2}},
        {"at": 2 * scale, "weights": {"bible": 0.2, "code": 0.8}},
        {"at": 4 * scale, "weights": {"bible": 0.2, "code": 0.8}},
        {"at": 6 * scale, "weights": {"bible": 0.6, "code": 0.4}, "ramp": "linear"},
    ]


REAL = _real(400_000)


@pytest.fixture(scope="module")
def real_corpora(tmp_path_factory):
    docs = python_source_documents(4 << 20)  # whole files, many far longer than a row
    code = write_jsonl(str(tmp_path_factory.mktemp("code") / "code.jsonl"), docs)
    return [
        Dataset.from_path("bible", kjv_path(), exhausted="repeat"),
        Dataset.from_path("code", code, exhausted="repeat"),
    ]


def _pipeline(datasets, gpt2, shuffle=True, schedule=REAL, **options):
    source = ScheduledMixtureWorkSource(datasets, schedule, unit="tokens", seed=3)
    pipeline = Pipeline(source).options(num_lanes=4, **options).tokenize(gpt2, parallelism=2).pack_flat(1024)
    return (pipeline.shuffle(16, seed=1) if shuffle else pipeline).batch(8)


def test_realized_shares_follow_the_schedule_within_0_01_in_every_segment(real_corpora, gpt2):
    schedule = Schedule(REAL, ["bible", "code"])
    # Segments of 400k tokens (100k per lane); each lane stays within about one row (1,025
    # tokens) of its target at both ends of a segment. A row counts at the run's position the
    # schedule uses: its lane's tokens before it times the number of lanes (rows of one batch
    # go to different places when a batch straddles a segment's end).
    edges = [400_000 * i for i in range(9)]
    counts, at = np.zeros((len(edges) - 1, 2)), np.zeros(4, np.int64)
    pipeline = _pipeline(real_corpora, gpt2, shuffle=False)
    for batch in pipeline:
        for row in batch.sources:
            segment = np.searchsorted(edges, at[batch.lane] * 4, side="right") - 1
            if segment < len(counts):
                counts[segment] += np.bincount(row[row >= 0], minlength=2)
            at[batch.lane] += int((row >= 0).sum())
        if at.min() * 4 >= edges[-1]:
            break
    pipeline.close()
    lane = schedule.for_lane(1)
    for i in range(len(edges) - 1):
        a, b = edges[i], edges[i + 1]
        target = (lane.target(0, b) - lane.target(0, a)) / (b - a)
        realized = counts[i, 0] / counts[i].sum()
        print(f"tokens [{a}, {b}): bible {realized:.4f}, target {target:.4f}")
        assert abs(realized - target) < 0.01, (a, b, realized, target)


def test_a_scheduled_mixture_is_elastic_and_resumable(real_corpora, gpt2):
    def make(d, r):
        return _pipeline(real_corpora, gpt2, schedule=_real(100_000), dp_rank=r, dp_world_size=d)

    # 20 steps x 4 lanes x 8 rows x 1025 tokens: 656k tokens, across the step and the ramp
    baseline, _ = run_job(make, 1, 20, 1)
    first, state = run_job(make, 2, 7, 1)
    second, state = run_job(make, 4, 6, 1, state=state)
    rest, _ = run_job(make, 1, 7, 1, state=state)
    assert {**first, **second, **rest} == baseline


def test_the_schedule_is_part_of_the_recipe(real_corpora, gpt2):
    other = [dict(p) for p in REAL]
    other[1]["at"] = 400_001
    pipeline = _pipeline(real_corpora, gpt2)
    state = pipeline.state_dict()
    changed = ScheduledMixtureWorkSource(real_corpora, other, unit="tokens", seed=3)
    moved = Pipeline(changed).options(num_lanes=4).tokenize(gpt2, parallelism=2).pack_flat(1024)
    with pytest.raises(ValueError, match=r"changed: source\.schedule"):
        moved.shuffle(16, seed=1).batch(8).load_state_dict(state)
