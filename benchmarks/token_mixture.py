#!/usr/bin/env python
"""Realized mixture shares where documents are long next to a lane's run: token and record ratios.

Real text, real tokenizer (GPT-2 BPE), 8 lanes, 2M delivered tokens, 3 seeds, two cases where one
chunk of a dataset outweighs a tenth of a lane's run (a lane delivers 250k tokens):

- ``three``: KJV verses (JSON lines) .40, KJV chapters .35 and whole Python standard-library files
  .25 (Parquet, row groups of 128, ``chunk_size=64``: a chunk of files holds ~200k tokens);
- ``giants``: KJV verses with the 66 books of the Bible as whole documents among them (up to
  ~60k tokens each; Parquet, ``chunk_size=64``) .50, small Python files .50.

Token ratios count delivered tokens per dataset; record ratios count delivered documents (those
whose first token was delivered: ``Batch.documents_per_dataset``). Writes
benchmarks/results/token_mixture.txt and .png.

    python benchmarks/token_mixture.py [--tokens 2000000] [--seeds 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import random
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # benchmarks.common, from a source checkout

from benchmarks.common import result_path, write_result  # noqa: E402
from zephon import Dataset, MixtureWorkSource, Pipeline  # noqa: E402
from zephon.testing import gpt2_tokenizer_dir, write_jsonl, write_parquet  # noqa: E402
from zephon.testing.data import kjv_grouped, kjv_records, python_source_documents  # noqa: E402

LANES, MAX_LENGTH, CHUNK_SIZE = 8, 2048, 64
# shuffle buffers (= window rows): 16 rows is 1/8 of a lane's run of 250k tokens; 256 rows is
# twice a whole lane's run, so the 2M tokens are a random half of each lane's first window
SHUFFLES = (16, 256)
CASES = {
    "three": {"verses": 0.40, "chapters": 0.35, "code": 0.25},
    "giants": {"giants": 0.50, "small_code": 0.50},
}


def write_corpora(tmp: str) -> dict[str, str]:
    """The datasets, from the KJV and the Python standard library."""
    verses = kjv_records()
    chapters = [{"text": t} for t in kjv_grouped("chapter")]
    giants = [{"text": v["text"]} for v in verses] + [{"text": t} for t in kjv_grouped("book")]
    random.Random(0).shuffle(giants)  # a few giant documents among many tiny ones
    code = python_source_documents(8 << 20)
    paths = {
        "verses": write_jsonl(os.path.join(tmp, "verses.jsonl"), [{"text": v["text"]} for v in verses]),
        "chapters": write_parquet(os.path.join(tmp, "chapters.parquet"), chapters, row_group_size=128),
        "code": write_parquet(os.path.join(tmp, "code.parquet"), code, row_group_size=128),
        "giants": write_parquet(os.path.join(tmp, "giants.parquet"), giants, row_group_size=128),
        "small_code": write_jsonl(
            os.path.join(tmp, "small_code.jsonl"), python_source_documents(4 << 20, max_doc_bytes=4 << 10)
        ),
    }
    return paths


def run(paths, tokenizer, case: str, unit: str, seed: int, tokens: int, shuffle: int):
    target = CASES[case]
    datasets = [Dataset.from_path(name, paths[name], exhausted="repeat") for name in target]
    source = MixtureWorkSource(datasets, target, unit=unit, seed=seed)
    pipeline = (
        Pipeline(source)
        .options(num_lanes=LANES, chunk_size=CHUNK_SIZE)
        .tokenize(tokenizer, parallelism=2)
        .pack_flat(MAX_LENGTH)
        .shuffle(shuffle, seed=seed)
        .batch(8)
    )
    n = len(target)
    counted, delivered, curve, mark = np.zeros(n), 0, [], 100_000
    for batch in pipeline:
        valid = batch.sources >= 0
        delivered += int(valid.sum())
        if unit == "tokens":
            counted += np.bincount(batch.sources[valid], minlength=n)
        else:
            counted += batch.documents_per_dataset(n)
        if delivered >= mark:
            curve.append((delivered, counted / counted.sum()))
            mark += 100_000
        if delivered >= tokens:
            break
    pipeline.close()
    shares = counted / counted.sum()
    return dict(zip(target, shares.tolist(), strict=True)), curve


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=2_000_000)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    lines = [
        f"Realized mixture shares after {args.tokens:,} delivered tokens, {LANES} lanes, GPT-2 BPE,",
        f"pack_flat({MAX_LENGTH}, wrap), microbatch 8; Parquet chunk_size={CHUNK_SIZE}; the shuffle buffer",
        "(and so the window) in rows. A window's realized shares are exact up to one row at its end;",
        "with a 256-row window the run stops inside each lane's first window and sees a random half",
        "of its rows, hence the larger spread there.",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}.",
        "Command: python benchmarks/token_mixture.py",
        "",
        f"{'shuffle':>7} {'case':<8} {'unit':<8} {'seed':>4}  {'worst |error|':>13}  "
        "realized shares (target)",
    ]
    curves, worst = {}, defaultdict(float)
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_corpora(tmp)
        tokenizer = gpt2_tokenizer_dir(os.path.join(tmp, "gpt2"))
        for shuffle in SHUFFLES:
            for case, target in CASES.items():
                for unit in ("tokens", "documents"):
                    for seed in range(1, args.seeds + 1):
                        start = time.monotonic()
                        shares, curve = run(paths, tokenizer, case, unit, seed, args.tokens, shuffle)
                        error = max(abs(shares[k] - target[k]) for k in target)
                        worst[shuffle, unit] = max(worst[shuffle, unit], error)
                        text = ", ".join(f"{k} {shares[k]:.4f} ({target[k]:.2f})" for k in target)
                        lines.append(f"{shuffle:>7} {case:<8} {unit:<8} {seed:>4}  {error:>13.4f}  {text}")
                        print(lines[-1], f"[{time.monotonic() - start:.1f}s]", flush=True)
                        if shuffle == SHUFFLES[0]:
                            curves[case, unit, seed] = curve
    lines.append("")
    for (shuffle, unit), w in worst.items():
        goal = " (goal <= 0.005)" if shuffle == SHUFFLES[0] else ""
        lines.append(f"shuffle {shuffle}: worst |realized - target| by {unit}: {w:.4f}{goal}")
    write_result("token_mixture.txt", lines, echo=False)
    _plot(curves, result_path("token_mixture.png"))
    print("\n".join(lines))


def _plot(curves, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CASES), figsize=(11, 4), sharey=False)
    for ax, (case, target) in zip(axes, CASES.items(), strict=True):
        for (c, unit, seed), curve in curves.items():
            if c != case or unit != "tokens":
                continue
            xs = [x / 1e6 for x, _ in curve]
            for i, name in enumerate(target):
                ax.plot(xs, [s[i] for _, s in curve], color=f"C{i}", alpha=0.7, lw=1,
                        label=name if seed == 1 else None)  # fmt: skip
        for i, share in enumerate(target.values()):
            ax.axhline(share, color=f"C{i}", lw=0.8, ls="--")
            ax.axhspan(share - 0.005, share + 0.005, color=f"C{i}", alpha=0.1)
        ax.set_title(
            f"{case}: token shares, shuffle {SHUFFLES[0]}, 3 seeds (band: target ± 0.005)", fontsize=9
        )
        ax.set_xlabel("delivered tokens (millions)")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("realized share of tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
