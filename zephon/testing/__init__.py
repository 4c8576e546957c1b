"""Helpers for tests, demos and benchmarks: real test material, synthetic data, conformance."""

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
