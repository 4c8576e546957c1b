"""Shared fixtures: the real GPT-2 tokenizer, and small synthetic corpora in every format."""

from __future__ import annotations

import os

import pytest

from zephon import Dataset, Pipeline
from zephon.testing import gpt2_tokenizer_dir, synthetic_documents, write_jsonl


@pytest.fixture(scope="session")
def gpt2(tmp_path_factory) -> str:
    return gpt2_tokenizer_dir(str(tmp_path_factory.mktemp("gpt2")))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> str:
    """A folder of 3 JSON lines shards, 1500 synthetic documents in all."""
    root = tmp_path_factory.mktemp("corpus")
    docs = synthetic_documents(1500, seed=7)
    for i in range(3):
        write_jsonl(os.path.join(root, f"part-{i}.jsonl"), docs[i * 500 : (i + 1) * 500])
    return str(root)


@pytest.fixture(scope="session")
def corpus_docs() -> list[dict]:
    return synthetic_documents(1500, seed=7)


@pytest.fixture(scope="session")
def make_rank(corpus, gpt2):
    """make(D, r, **options) -> rank r of D's pipeline over the corpus: 8 lanes, windows of
    about 8 batches, so that a few global steps cross several windows."""

    def make(
        world: int,
        rank: int,
        runner: str = "thread",
        parallelism: int = 2,
        seed: int = 5,
        **overrides,
    ):
        options = dict(num_lanes=8, chunk_bytes=2048, flush_every=2, runner=runner)
        options.update(overrides)
        ds = Dataset.from_path("synthetic", corpus, exhausted="repeat")
        return (
            Pipeline(ds)
            .options(dp_rank=rank, dp_world_size=world, **options)
            .tokenize(gpt2, parallelism=parallelism)
            .pack_flat(max_length=64)
            .shuffle(buffer_size=8, seed=seed)
            .batch(microbatch_size=2)
        )

    return make
