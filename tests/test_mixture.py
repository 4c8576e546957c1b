"""Mixtures: every lane follows the weights; exhaustion stops or repeats; bad mixtures explained."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from zephon import Dataset, MixtureWorkSource, Pipeline
from zephon.testing import drain, run_job, synthetic_documents, write_jsonl, write_parquet

EOS = 50256


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    short = synthetic_documents(3000, seed=1, max_words=10)
    long = synthetic_documents(1000, seed=2, min_words=60, max_words=200)
    return (
        Dataset.from_path("short", write_jsonl(str(root / "short.jsonl"), short), exhausted="repeat"),
        Dataset.from_path("long", write_parquet(str(root / "long.parquet"), long, 50), exhausted="repeat"),
    )


def _documents_per_dataset(batches, n):
    counts = np.zeros(n, np.int64)
    for b in batches:
        ends = b.tokens == EOS
        counts += np.bincount(b.sources[ends & (b.sources >= 0)], minlength=n)
    return counts


def _pipeline(source, gpt2, lanes=4, **options):
    p = Pipeline(source).options(num_lanes=lanes, chunk_size=25, chunk_bytes=2000, **options)
    return p.tokenize(gpt2).pack_flat(128).batch(2)


def test_record_mixture_is_followed_on_every_lane(two_corpora, gpt2):
    source = MixtureWorkSource(list(two_corpora), {"short": 0.3, "long": 0.7}, seed=1)
    pipeline = _pipeline(source, gpt2)
    batches = drain(pipeline, 800)
    for lane in range(4):
        docs = _documents_per_dataset([b for b in batches if b.lane == lane], 2)
        share = docs[0] / docs.sum()
        assert abs(share - 0.3) < 0.03, f"lane {lane}: short share {share:.3f}, want 0.3"
    stats = pipeline.stats()["tokens"]
    assert stats["long"] > 5 * stats["short"]  # 0.7 of the records are the long ones


def test_mixture_is_elastic_and_resumable(two_corpora, gpt2):
    def make(d, r):
        source = MixtureWorkSource(list(two_corpora), {"short": 1, "long": 3}, seed=4)
        return _pipeline(source, gpt2, dp_rank=r, dp_world_size=d)

    baseline, _ = run_job(make, 1, 10, 2)
    first, state = run_job(make, 4, 4, 2)
    rest, _ = run_job(make, 2, 6, 2, state=state)
    assert {**first, **rest} == baseline


def test_repeat_starts_a_new_permutation_every_epoch(tmp_path, gpt2):
    docs = synthetic_documents(40, seed=5)
    ds = Dataset.from_path("d", write_jsonl(str(tmp_path / "d.jsonl"), docs), exhausted="repeat")
    pipeline = Pipeline(ds).options(chunk_bytes=2000).tokenize(gpt2).pack_flat(64).batch(1)
    tokens = np.concatenate([b.tokens[0] for b in drain(pipeline, 400)])  # wrap: the lane's stream
    ends = np.flatnonzero(tokens == EOS)
    starts = np.concatenate([[0], ends[:-1] + 1])
    docs = [tuple(tokens[a : b + 1].tolist()) for a, b in zip(starts, ends, strict=True)]
    first, second = docs[:40], docs[40:80]
    assert sorted(first) == sorted(second) and first != second


def test_a_stopping_dataset_ends_the_lane_when_it_runs_out(two_corpora, tmp_path, gpt2):
    few = Dataset.from_path("few", write_jsonl(str(tmp_path / "f.jsonl"), synthetic_documents(200, 9)))
    source = MixtureWorkSource([few, two_corpora[1]], {"few": 1, "long": 1})
    batches = drain(_pipeline(source, gpt2, lanes=2), 10**6)
    docs = _documents_per_dataset(batches, 2)
    assert docs[0] == 200, "every record of the stopping dataset is delivered once"
    assert 0 < docs[1] < 1000 * 2


@pytest.mark.parametrize(
    ("mixture", "message"),
    [
        (
            {"short": 1, "lng": 1},
            r"mixture names unknown dataset\(s\) \['lng'\]; datasets are \['short', 'long'\]",
        ),
        ({"short": 1}, r"no weight for dataset\(s\) \['long'\]"),
        ({"short": 1, "long": -1}, "weight for 'long' must be a positive number"),
        (None, "need a mixture"),
        (
            {"short": 1e308, "long": 1e308},
            r"sum to more than the largest float \(1\.8e\+308\): scale them all down .*"
            r"divide each by 1e\+308",
        ),
        ({"short": math.inf, "long": 1}, r"'short' must be a positive number, got inf: give finite weights"),
        ({"short": 1, "long": math.nan}, r"'long' must be a positive number, got nan: give finite weights"),
        ({"short": 10**400, "long": 1}, r"'short' must be a positive number, got 1000+: give finite weights"),
        (
            {"short": 1e-320, "long": 1},
            r"'short' is 1e-320, under the smallest normal float .*: scale all the weights up",
        ),
        (
            {"short": 1e-300, "long": 1e300},
            r"'short' \(1e-300\) is too small next to the sum of the weights \(1e\+300\): its share 0\.0 "
            r"is under .*; raise it, or leave the dataset out",
        ),
    ],
)
def test_bad_mixtures_are_explained(two_corpora, mixture, message):
    with pytest.raises(ValueError, match=message):
        MixtureWorkSource(list(two_corpora), mixture)


def test_weights_count_by_their_ratio_however_large_or_small(two_corpora):
    for scale in (1e-300, 1, 1e300):
        source = MixtureWorkSource(list(two_corpora), {"short": scale, "long": 3 * scale})
        assert source.shares == pytest.approx([0.25, 0.75])


def test_too_few_chunks_for_the_lanes_is_explained(tmp_path, gpt2):
    ds = Dataset.from_path("tiny", write_jsonl(str(tmp_path / "t.jsonl"), synthetic_documents(5, 1)))
    pipeline = Pipeline(ds).options(num_lanes=8, chunk_bytes=1 << 20).tokenize(gpt2).pack_flat(8).batch(1)
    with pytest.raises(ValueError, match=r"has 1 chunks for 8 lanes.*lower chunk_size"):
        drain(pipeline, 1)
    rows = Dataset.from_path("rows", write_parquet(str(tmp_path / "t.parquet"), synthetic_documents(5, 1)))
    pipeline = Pipeline(rows).options(num_lanes=8).tokenize(gpt2).pack_flat(8).batch(1)
    with pytest.raises(ValueError, match=r"has 5 chunks for 8 lanes.*use fewer lanes"):
        drain(pipeline, 1)


def test_a_packed_row_tells_which_dataset_each_span_came_from(two_corpora, gpt2):
    source = MixtureWorkSource(list(two_corpora), {"short": 1, "long": 1}, seed=1)
    pipeline = Pipeline(source).options(chunk_size=5, chunk_bytes=300).tokenize(gpt2).pack_flat(512).batch(1)
    batches = drain(pipeline, 30)
    mixed = [b for b in batches if len({d for d, _, _ in b.source_spans(0) if d >= 0}) == 2]
    assert mixed, "some rows should hold documents of both datasets"
    spans = mixed[0].source_spans(0)
    assert spans[0][1] == 0 and spans[-1][2] == 513
    assert all(a[2] == b[1] and a[0] != b[0] for a, b in itertools.pairwise(spans))
    assert pipeline.dataset_names == ["short", "long"]


@pytest.fixture(scope="module")
def lumpy_mixture(tmp_path_factory):
    """Two corpora, one with empty documents: what the mixer takes depends on what the workers
    made of each chunk."""
    root = tmp_path_factory.mktemp("lumpy")
    with_empty = [
        {"text": "" if i % 3 == 0 else d["text"]} for i, d in enumerate(synthetic_documents(900, 11))
    ]
    return [
        Dataset.from_path("a", write_jsonl(str(root / "a.jsonl"), with_empty), exhausted="repeat"),
        Dataset.from_path(
            "b", write_jsonl(str(root / "b.jsonl"), synthetic_documents(600, 12)), exhausted="repeat"
        ),
    ]


def _lumpy(datasets, gpt2, runner, unit_tokens):
    unit = "tokens" if unit_tokens else "documents"
    source = MixtureWorkSource(datasets, {"a": 2, "b": 1}, unit=unit, seed=5)
    p = Pipeline(source).options(num_lanes=2, chunk_bytes=1500, runner=runner)
    return p.tokenize(gpt2, parallelism=3).pack_flat(48).shuffle(4, seed=2).batch(2)


@pytest.mark.parametrize("unit_tokens", [False, True], ids=["documents", "tokens"])
@pytest.mark.parametrize("runner", ["thread", "process"])
def test_a_mixture_is_the_same_under_every_runner(lumpy_mixture, gpt2, runner, unit_tokens):
    want = [b.digest() for b in drain(_lumpy(lumpy_mixture, gpt2, "inline", unit_tokens), 120)]
    got = [b.digest() for b in drain(_lumpy(lumpy_mixture, gpt2, runner, unit_tokens), 120)]
    assert got == want


@pytest.mark.parametrize("runner", ["inline", "thread", pytest.param("process", marks=pytest.mark.slow)])
def test_a_mixture_conforms_restore_at_every_step(lumpy_mixture, gpt2, runner):
    from zephon.testing import check_conformance

    every = 7 if runner == "process" else 2
    check_conformance(lambda: _lumpy(lumpy_mixture, gpt2, runner, False), steps=60, tail=3, every=every)


def test_a_mixing_lane_state_stays_small_over_many_steps(lumpy_mixture, gpt2):
    import json

    pipeline = _lumpy(lumpy_mixture, gpt2, "inline", True)
    iterator, sizes = iter(pipeline), {}
    for step in range(1, 1201):
        next(iterator)
        if step in (40, 400, 1200):
            sizes[step] = max(len(json.dumps(v)) for v in pipeline.state_dict()["lanes"].values())
    pipeline.close()
    assert max(sizes.values()) < 1024 and sizes[1200] - sizes[400] < 64, sizes
