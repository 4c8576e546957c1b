#!/usr/bin/env python
"""Restore to first batch against a fresh start, and checkpoint bytes per lane.

Real text (KJV verses, KJV chapters, whole Python standard-library files; JSON lines), a token
mixture .40/.35/.25, GPT-2 BPE, ``pack_flat(2048)``, shuffle 64 (windows of 64 rows), microbatch
8, thread runner, parallelism 2; at 8 and 64 lanes. The checkpoint is taken half-way through
every lane's second full-size window (windows ramp up from one microbatch), where a restore must
replay a whole window. Fresh
starts and restores alternate, 3 of each, in one process; medians. Writes
benchmarks/results/restore.txt.

    python benchmarks/restore.py
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # benchmarks.common, from a source checkout

from benchmarks.common import MIXTURE, write_result  # noqa: E402
from zephon import Dataset, MixtureWorkSource, Pipeline  # noqa: E402
from zephon.testing import gpt2_tokenizer_dir, take  # noqa: E402
from zephon.testing.data import real_text_corpora  # noqa: E402

SHUFFLE, MICROBATCH = 64, 8


def build(paths: dict[str, str], tokenizer: str, lanes: int, backend: str = "auto") -> Pipeline:
    datasets = [Dataset.from_path(n, p, exhausted="repeat") for n, p in paths.items()]
    source = MixtureWorkSource(datasets, MIXTURE, unit="tokens", seed=1)
    return (
        Pipeline(source)
        .options(num_lanes=lanes)
        .tokenize(tokenizer, parallelism=2, backend=backend)
        .pack_flat(2048)
        .shuffle(SHUFFLE, seed=1)
        .batch(MICROBATCH)
    )


def first_batch_seconds(paths, tokenizer, lanes: int, backend: str, state: dict | None) -> float:
    start = time.perf_counter()
    pipeline = build(paths, tokenizer, lanes, backend)
    if state is not None:
        pipeline.load_state_dict(state)
    take(pipeline, 1)
    seconds = time.perf_counter() - start
    pipeline.close()
    return seconds


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    logging.basicConfig(level=logging.WARNING)
    lines = [
        "Time to the first batch: a fresh start against a restore from a checkpoint taken half-way",
        f"through each lane's second full-size window ({SHUFFLE} rows of 2049 tokens; a fresh start's",
        "first window is one microbatch). Token mixture",
        f"{MIXTURE}, GPT-2 BPE, thread runner, parallelism 2, microbatch {MICROBATCH};",
        "medians of 3 alternating runs in one process.",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}.",
        "Command: python benchmarks/restore.py",
        "",
        f"{'lanes':>5}  {'tokenizer':>10}  {'fresh start':>11}  {'restore':>8}  {'restore/fresh':>13}  "
        f"{'state bytes/lane':>16}",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: path for name, (path, _) in real_text_corpora(tmp).items()}
        tokenizer = gpt2_tokenizer_dir(os.path.join(tmp, "gpt2"))
        for lanes in (8, 64):
            pipeline = build(paths, tokenizer, lanes)
            ops, window = pipeline.spec().lane_ops(), 0
            ramp = 0  # batches of the windows before the first full-size one
            while ops.rows_in(window) < ops.window_rows:
                ramp, window = ramp + ops.rows_in(window) // MICROBATCH, window + 1
            per_window = ops.window_rows // MICROBATCH
            take(pipeline, lanes * (ramp + per_window + per_window // 2))
            state = json.loads(json.dumps(pipeline.state_dict()))
            pipeline.close()
            assert all(lane["delivered"] == per_window // 2 for lane in state["lanes"].values())
            size = max(len(json.dumps(v)) for v in state["lanes"].values())
            for backend, name in (("tokenizers", "HF"), ("auto", "fastokens")):
                fresh, restored = [], []
                for _ in range(3):
                    fresh.append(first_batch_seconds(paths, tokenizer, lanes, backend, None))
                    restored.append(first_batch_seconds(paths, tokenizer, lanes, backend, state))
                f, r = statistics.median(fresh), statistics.median(restored)
                lines.append(f"{lanes:>5}  {name:>10}  {f:>10.2f}s  {r:>7.2f}s  {r / f:>13.2f}  {size:>16}")
                print(lines[-1], flush=True)
    write_result("restore.txt", lines)


if __name__ == "__main__":
    main()
