#!/usr/bin/env python
"""Realized token shares of a two-corpus mixture, by tokens (TokenEstimation) and by records.

Real text, real tokenizer: the KJV Bible (verses, ~0.15 GPT-2 tokens per byte of JSON lines)
and Python standard-library sources (~0.4 tokens per byte), GPT-2 BPE, 4 lanes, target 40/60.
Writes benchmarks/results/token_mixture.txt and .png.

    python benchmarks/token_mixture.py [--tokens 2000000]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

import numpy as np

from zephon import Dataset, Pipeline, StaticMixtureWorkSource, TokenEstimation
from zephon.testing import gpt2_tokenizer_dir, kjv_path, write_jsonl
from zephon.testing.data import python_source_documents

TARGET = {"bible": 0.4, "code": 0.6}
HERE = os.path.dirname(os.path.abspath(__file__))


def run(tmp: str, tokens: int, by_tokens: bool, seed: int) -> tuple[list[int], list[float], dict]:
    code = os.path.join(tmp, "code.jsonl")
    if not os.path.exists(code):
        write_jsonl(code, python_source_documents(4 << 20, max_doc_bytes=12 << 10))
    datasets = [
        Dataset.from_path("bible", kjv_path(), exhausted="repeat"),
        Dataset.from_path("code", code, exhausted="repeat"),
    ]
    estimation = TokenEstimation(sample_chunks=16) if by_tokens else None
    source = StaticMixtureWorkSource(datasets, TARGET, token_estimation=estimation, seed=seed)
    pipeline = (
        Pipeline(source)
        .options(num_lanes=4, chunk_bytes=32 << 10, flush_every=4)
        .tokenize(gpt2_tokenizer_dir(os.path.join(tmp, "gpt2")), parallelism=2)
        .pack_flat(1024)
        .shuffle(16, seed=1)
        .batch(8)
    )
    counts, xs, shares, next_mark = np.zeros(2), [], [], 100_000
    for batch in pipeline:
        counts += np.bincount(batch.sources[batch.sources >= 0], minlength=2)
        if counts.sum() >= next_mark:
            xs.append(int(counts.sum()))
            shares.append(float(counts[0] / counts.sum()))
            next_mark += 100_000
        if counts.sum() >= tokens:
            break
    pipeline.close()
    return xs, shares, pipeline.state_dict()["rates"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=2_000_000)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    lines = [
        f"Token shares of a {TARGET} mixture of KJV verses and Python sources, GPT-2 BPE,",
        f"4 lanes, 32 KiB chunks; share of 'bible' after {args.tokens:,} delivered tokens.",
        "",
        "mode              seed  bible share  |error|   tokens/byte measured",
    ]
    curves = {}
    with tempfile.TemporaryDirectory() as tmp:
        for by_tokens in (True, False):
            mode = "token ratio" if by_tokens else "record ratio"
            for seed in range(1, args.seeds + 1):
                start = time.monotonic()
                xs, shares, rates = run(tmp, args.tokens, by_tokens, seed)
                error = abs(shares[-1] - TARGET["bible"])
                rate_text = ", ".join(f"{k} {v:.3f}" for k, v in rates.items()) if by_tokens else "-"
                lines.append(f"{mode:<16}  {seed:>4}  {shares[-1]:.4f}       {error:.4f}    {rate_text}")
                print(lines[-1], f"({time.monotonic() - start:.1f}s)", flush=True)
                curves[(mode, seed)] = (xs, shares)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(HERE, "results", "token_mixture.txt"), "w") as f:
        f.write(text)
    _plot(curves, os.path.join(HERE, "results", "token_mixture.png"))
    print(text)


def _plot(curves, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (mode, seed), (xs, shares) in curves.items():
        ax.plot(np.array(xs) / 1e6, shares, color="C0" if mode == "token ratio" else "C3",
                alpha=0.8, label=mode if seed == 1 else None)  # fmt: skip
    ax.axhline(TARGET["bible"], color="k", lw=0.8, ls="--", label="target")
    ax.axhspan(TARGET["bible"] - 0.01, TARGET["bible"] + 0.01, color="k", alpha=0.08, label="target ± 0.01")
    ax.set_xlabel("delivered tokens (millions)")
    ax.set_ylabel("share of 'bible' tokens")
    ax.set_title("Token-ratio vs record-ratio mixing (KJV + Python, GPT-2 BPE)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
