"""Token-ratio mixing on real text: KJV verses and Python sources, GPT-2 BPE, over 2M tokens."""

from __future__ import annotations

import json

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource, TokenEstimation
from zephon.testing import kjv_path, run_job, take, write_jsonl
from zephon.testing.data import python_source_documents

TARGET = {"bible": 0.4, "code": 0.6}


@pytest.fixture(scope="module")
def real_corpora(tmp_path_factory):
    # Files over 12 KB are left out: one 200 KB file is a 70k-token atom, 15% of a lane's share
    # of 2M tokens, and no mixing can be finer than its atoms.
    docs = python_source_documents(4 << 20, max_doc_bytes=12 << 10)
    code = write_jsonl(str(tmp_path_factory.mktemp("code") / "code.jsonl"), docs)
    return [
        Dataset.from_path("bible", kjv_path(), exhausted="repeat"),
        Dataset.from_path("code", code, exhausted="repeat"),
    ]


def _pipeline(datasets, gpt2, estimation, **options):
    source = StaticMixtureWorkSource(datasets, TARGET, token_estimation=estimation, seed=3)
    return (
        Pipeline(source)
        .options(num_lanes=4, chunk_bytes=32 << 10, flush_every=4, **options)
        .tokenize(gpt2, parallelism=2)
        .pack_flat(1024)
        .shuffle(16, seed=1)
        .batch(8)
    )


def test_token_shares_are_within_0_01_of_the_target_over_2m_tokens(real_corpora, gpt2):
    pipeline = _pipeline(real_corpora, gpt2, TokenEstimation(sample_chunks=16))
    iterator = iter(pipeline)
    rates = pipeline.state_dict()["rates"]
    assert rates["code"] > 1.3 * rates["bible"], f"the corpora should differ in tokens per byte: {rates}"
    delivered = 0
    for batch in iterator:
        delivered += int((batch.sources >= 0).sum())
        if delivered >= 2_000_000:
            break
    pipeline.close()
    tokens = pipeline.stats()["tokens"]
    assert sum(tokens.values()) == delivered
    lane_state = max(len(json.dumps(v)) for v in pipeline.state_dict()["lanes"].values())
    assert lane_state < 1024, f"a mixing lane's state is {lane_state} bytes"
    shares = {k: v / delivered for k, v in tokens.items()}
    print(f"\ntokens per byte {rates}; realized token shares over {delivered} tokens: {shares}")
    for name, target in TARGET.items():
        assert abs(shares[name] - target) < 0.01, f"{name}: {shares[name]:.4f} vs target {target}"


def test_measured_rates_are_kept_in_the_state_and_not_measured_again(real_corpora, gpt2, monkeypatch):
    pipeline = _pipeline(real_corpora, gpt2, TokenEstimation(sample_chunks=4))
    assert pipeline.state_dict()["rates"] is None, "nothing is measured before the first run"
    take(pipeline, 1)
    state = pipeline.state_dict()
    pipeline.close()
    assert set(state["rates"]) == {"bible", "code"}
    restored = _pipeline(real_corpora, gpt2, TokenEstimation(sample_chunks=4))

    def no_measuring(*args, **kwargs):
        raise AssertionError("a restore must reuse the checkpoint's rates")

    monkeypatch.setattr(StaticMixtureWorkSource, "measure_rates", no_measuring)
    restored.load_state_dict(state)
    assert restored.state_dict()["rates"] == state["rates"]
    assert take(restored, 2), "runs on the checkpoint's rates"
    restored.close()


def test_token_mixture_is_elastic_and_resumable(real_corpora, gpt2):
    def make(d, r):
        return _pipeline(real_corpora, gpt2, TokenEstimation(sample_chunks=4), dp_rank=r, dp_world_size=d)

    baseline, _ = run_job(make, 1, 8, 1)
    first, state = run_job(make, 2, 3, 1)
    rest, _ = run_job(make, 4, 5, 1, state=state)
    assert {**first, **rest} == baseline
