"""The tests' small corpus and the rank pipelines over it (``conftest``'s ``corpus`` and
``make_rank`` fixtures), for the tests and the reliability benchmark alike."""

from __future__ import annotations

import os

from zephon import Dataset, Pipeline
from zephon.testing import synthetic_documents, write_jsonl


def write_corpus(folder: str) -> str:
    """A folder of 3 JSON lines shards, 1500 synthetic documents in all (seed 7)."""
    os.makedirs(folder, exist_ok=True)
    docs = synthetic_documents(1500, seed=7)
    for i in range(3):
        write_jsonl(os.path.join(folder, f"part-{i}.jsonl"), docs[i * 500 : (i + 1) * 500])
    return folder


def rank_pipeline(
    corpus: str,
    gpt2: str,
    world: int,
    rank: int,
    runner: str = "thread",
    parallelism: int = 2,
    seed: int = 5,
    exhausted: str = "repeat",
    **overrides,
) -> Pipeline:
    """Rank ``rank`` of ``world``'s pipeline over ``corpus``: 8 lanes, windows of 8 rows (the
    shuffle buffer) = 4 batches, so that a few global steps cross several windows."""
    options = dict(num_lanes=8, chunk_bytes=2048, runner=runner)
    options.update(overrides)
    return (
        Pipeline(Dataset.from_path("synthetic", corpus, exhausted=exhausted))
        .options(dp_rank=rank, dp_world_size=world, **options)
        .tokenize(gpt2, parallelism=parallelism)
        .pack_flat(max_length=64)
        .shuffle(buffer_size=8, seed=seed)
        .batch(microbatch_size=2)
    )
