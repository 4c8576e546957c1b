"""Helpers for users, tests, demos and benchmarks: real test material (GPT-2 BPE, KJV, images),
synthetic data, the conformance check, and running a job's ranks in one process. Fake stores
and job launchers live with the tests and scripts (tests/support, scripts/train_jobs.py)."""

from zephon.testing.conformance import check_conformance, drain, take
from zephon.testing.data import (
    gpt2_tokenizer_dir,
    kjv_path,
    synthetic_documents,
    write_arrow,
    write_jsonl,
    write_parquet,
    write_text,
)

__all__ = [
    "check_conformance",
    "drain",
    "gpt2_tokenizer_dir",
    "kjv_path",
    "synthetic_documents",
    "take",
    "write_arrow",
    "write_jsonl",
    "write_parquet",
    "write_text",
]

from zephon.testing.elastic import logged_losses, run_job, step_digests

__all__ += ["logged_losses", "run_job", "step_digests"]
