"""Token-ratio mixing on real text: KJV verses and whole Python source files, GPT-2 BPE."""

from __future__ import annotations

import json

import pytest

from zephon import Dataset, MixtureWorkSource, Pipeline
from zephon.testing import kjv_path, run_job, write_jsonl
from zephon.testing.data import python_source_documents

TARGET = {"bible": 0.4, "code": 0.6}
MAX_LENGTH = 1024


@pytest.fixture(scope="module")
def real_corpora(tmp_path_factory):
    # whole files, up to 200 KB (70k tokens): far longer than a row, and than many chunks
    docs = python_source_documents(4 << 20)
    assert max(len(d["text"]) for d in docs) > 100 << 10
    code = write_jsonl(str(tmp_path_factory.mktemp("code") / "code.jsonl"), docs)
    return [
        Dataset.from_path("bible", kjv_path(), exhausted="repeat"),
        Dataset.from_path("code", code, exhausted="repeat"),
    ]


def _pipeline(datasets, gpt2, **options):
    source = MixtureWorkSource(datasets, TARGET, unit="tokens", seed=3)
    return (
        Pipeline(source)
        .options(num_lanes=4, **options)
        .tokenize(gpt2, parallelism=2)
        .pack_flat(MAX_LENGTH)
        .shuffle(16, seed=1)
        .batch(8)
    )


def test_token_shares_are_within_0_005_of_the_target_over_2m_tokens(real_corpora, gpt2):
    pipeline = _pipeline(real_corpora, gpt2)
    delivered = 0
    for batch in pipeline:
        delivered += int((batch.sources >= 0).sum())
        if delivered >= 2_000_000:
            break
    pipeline.close()
    tokens = pipeline.stats()["tokens"]
    assert sum(tokens.values()) == delivered
    lane_state = max(len(json.dumps(v)) for v in pipeline.state_dict()["lanes"].values())
    assert lane_state < 1024, f"a mixing lane's state is {lane_state} bytes"
    shares = {k: v / delivered for k, v in tokens.items()}
    print(f"\nrealized token shares over {delivered} tokens: {shares}")
    for name, target in TARGET.items():
        assert abs(shares[name] - target) < 0.005, f"{name}: {shares[name]:.4f} vs target {target}"


def test_every_lane_stays_within_one_row_of_its_target_at_every_window(real_corpora, gpt2):
    pipeline, worst = _pipeline(real_corpora, gpt2, runner="inline"), 0.0
    for _, batch in zip(range(400), pipeline, strict=False):
        lane = pipeline.state_dict()["lanes"][str(batch.lane)]
        if lane["delivered"] == 0:  # a window was fully delivered: its tokens are all counted
            total = sum(lane["tokens"])
            for d, name in enumerate(TARGET):
                worst = max(worst, abs(lane["tokens"][d] - TARGET[name] * total))
    pipeline.close()
    print(f"\nlargest distance from the target, in tokens, at a window end: {worst:.0f}")
    assert worst <= MAX_LENGTH + 1


def test_token_mixture_is_elastic_and_resumable(real_corpora, gpt2):
    def make(d, r):
        return _pipeline(real_corpora, gpt2, dp_rank=r, dp_world_size=d)

    baseline, _ = run_job(make, 1, 8, 1)
    first, state = run_job(make, 2, 3, 1)
    rest, _ = run_job(make, 4, 5, 1, state=state)
    assert {**first, **rest} == baseline
