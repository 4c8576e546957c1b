#!/usr/bin/env python
"""Padding, empty rows and dropped tokens of the delivered stream, at default options.

Real text (KJV verses, KJV chapters, whole Python standard-library files; JSON lines), GPT-2
BPE, 8 lanes, ``pack_flat(2048)``, shuffle 256, microbatch 8, default chunking and windows:

- a three-dataset token mixture (every dataset repeating), 2M+ delivered tokens: the share of
  label positions that are padding (-100), and rows that are all padding;
- each dataset alone, ``exhausted="stop"``, read to its end: tokens delivered against the
  tokens of all its documents (tokenized one by one, EOS included): what was dropped.

Wrap packing and best-fit are both measured. Writes benchmarks/results/padding.txt.

    python benchmarks/padding.py [--tokens 2000000]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # benchmarks.common, from a source checkout

from benchmarks.common import MIXTURE, write_result  # noqa: E402
from zephon import Dataset, MixtureWorkSource, Pipeline  # noqa: E402
from zephon.io import load_tokenizer  # noqa: E402
from zephon.testing import gpt2_tokenizer_dir  # noqa: E402
from zephon.testing.data import real_text_corpora  # noqa: E402


def build(source, tokenizer: str, algorithm: str) -> Pipeline:
    return (
        Pipeline(source)
        .options(num_lanes=8)
        .tokenize(tokenizer, parallelism=2)
        .pack_flat(2048, algorithm=algorithm)
        .shuffle(256, seed=1)
        .batch(8)
    )


def measure(pipeline: Pipeline, tokens: int | None) -> dict:
    labels = padded = rows = empty = delivered = 0
    for batch in pipeline:
        pad = batch.sources[:, 1:] < 0  # label positions that are padding (-100)
        labels, padded = labels + pad.size, padded + int(pad.sum())
        rows += len(batch.sources)
        empty += int(((batch.sources >= 0).sum(axis=1) == 0).sum())
        delivered += int((batch.sources >= 0).sum())
        if tokens is not None and delivered >= tokens:
            break
    pipeline.close()
    return {"padding": padded / labels, "rows": rows, "empty": empty, "delivered": delivered}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=2_000_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    lines = [
        "Padding of the delivered stream at default options: 8 lanes, GPT-2 BPE, pack_flat(2048),",
        "shuffle 256, microbatch 8, default chunking and windows. Real text: KJV verses, KJV",
        "chapters, Python standard-library files (JSON lines).",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}.",
        "Command: python benchmarks/padding.py",
        "",
        f"{'run':<44} {'packing':<8} {'padding':>8} {'rows':>6} {'empty':>6} {'dropped':>8}",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        corpora = real_text_corpora(tmp)
        tokenizer = gpt2_tokenizer_dir(os.path.join(tmp, "gpt2"))
        tok = load_tokenizer(tokenizer)
        for algorithm in ("wrap", "best_fit"):
            datasets = [Dataset.from_path(n, p, exhausted="repeat") for n, (p, _) in corpora.items()]
            source = MixtureWorkSource(datasets, MIXTURE, unit="tokens", seed=1)
            start = time.monotonic()
            m = measure(build(source, tokenizer, algorithm), args.tokens)
            run = f"mixture {MIXTURE}"[:44]
            lines.append(
                f"{run:<44} {algorithm:<8} {m['padding']:>8.4%} {m['rows']:>6} {m['empty']:>6} {'-':>8}"
            )
            print(lines[-1], f"[{time.monotonic() - start:.1f}s]", flush=True)
            for name, (path, texts) in corpora.items():
                want = sum(len(ids) + 1 for ids in tok.encode_batch(texts) if ids)  # + EOS
                start = time.monotonic()
                m = measure(build(Dataset.from_path(name, path), tokenizer, algorithm), None)
                run = f"{name} alone, to its end ({want:,} tokens)"
                dropped = want - m["delivered"]
                lines.append(
                    f"{run:<44} {algorithm:<8} {m['padding']:>8.4%} {m['rows']:>6} {m['empty']:>6} "
                    f"{dropped:>8}"
                )
                print(lines[-1], f"[{time.monotonic() - start:.1f}s]", flush=True)
    lines += [
        "",
        "padding: share of label positions that are -100; empty: rows without a token; dropped:",
        "tokens of the dataset never delivered. The mixture runs are the padding figure (2M tokens,",
        "no dataset ends). The runs to a dataset's end count what was dropped; they are short (60",
        "to 120 rows per lane), so each lane's end, its last row padded and padding rows filling",
        "its last microbatch, weighs a few percent there. Best-fit rows end in padding by nature",
        "(whole documents), but no row before a lane's end is empty.",
    ]
    write_result("padding.txt", lines)


if __name__ == "__main__":
    main()
