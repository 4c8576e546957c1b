#!/usr/bin/env python
"""A scheduled mixture over a run: target against realized token shares, on real text.

KJV chapters, whole Python standard-library files (many far longer than a row) and KJV verses,
GPT-2 BPE, 8 lanes, rows of 2,049 tokens, a shuffle of 64 rows per lane, 4M delivered tokens. The
schedule (in the run's delivered tokens): verses .6 / chapters .3 / code .1 from the start; a
step at 1M to .2 / .3 / .5; a linear ramp from 2M to 3M to .1 / .7 / .2; then that holds.

A delivered row counts at the run's position the schedule uses: the tokens its lane delivered
before it times the number of lanes. Shares are measured per segment of 250k tokens (what the
schedule asks for over the segment is the integral of its weights). Writes
benchmarks/results/schedule.txt and .png.

    python benchmarks/schedule.py [--tokens 4000000]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import tempfile
import time

import numpy as np

from zephon import Dataset, Pipeline, ScheduledMixtureWorkSource, TokenEstimation
from zephon.testing import gpt2_tokenizer_dir, write_jsonl, write_parquet
from zephon.testing.data import kjv_grouped, kjv_records, python_source_documents
from zephon.work import Schedule

HERE = os.path.dirname(os.path.abspath(__file__))
LANES, MAX_LENGTH, SHUFFLE, SEGMENT = 8, 2048, 64, 250_000
NAMES = ["verses", "chapters", "code"]
SCHEDULE = [
    {"at": 0, "weights": {"verses": 0.6, "chapters": 0.3, "code": 0.1}},
    {"at": 1_000_000, "weights": {"verses": 0.2, "chapters": 0.3, "code": 0.5}},
    {"at": 2_000_000, "weights": {"verses": 0.2, "chapters": 0.3, "code": 0.5}},
    {"at": 3_000_000, "weights": {"verses": 0.1, "chapters": 0.7, "code": 0.2}, "ramp": "linear"},
]


def datasets(tmp: str) -> list[Dataset]:
    verses = [{"text": v["text"]} for v in kjv_records()]
    chapters = [{"text": t} for t in kjv_grouped("chapter")]
    code = python_source_documents(8 << 20)
    paths = {
        "verses": write_jsonl(os.path.join(tmp, "verses.jsonl"), verses),
        "chapters": write_parquet(os.path.join(tmp, "chapters.parquet"), chapters, 128),
        "code": write_parquet(os.path.join(tmp, "code.parquet"), code, 128),
    }
    return [Dataset.from_path(name, paths[name], exhausted="repeat") for name in NAMES]


def measure(tmp: str, total: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Tokens per dataset in each segment, per-row (position, dataset counts), and seconds."""
    source = ScheduledMixtureWorkSource(datasets(tmp), SCHEDULE, token_estimation=TokenEstimation(), seed=1)
    pipeline = (
        Pipeline(source)
        .options(num_lanes=LANES)
        .tokenize(gpt2_tokenizer_dir(tmp), parallelism=2)
        .pack_flat(MAX_LENGTH)
        .shuffle(SHUFFLE, seed=2)
        .batch(8)
    )
    segments = np.zeros((total // SEGMENT, len(NAMES)))
    rows, at, start = [], np.zeros(LANES, np.int64), time.monotonic()
    last = start
    for batch in pipeline:
        for row in batch.sources:
            counts = np.bincount(row[row >= 0], minlength=len(NAMES))
            position = int(at[batch.lane]) * LANES
            if position < total:
                segments[position // SEGMENT] += counts
                rows.append((position, *counts))
            at[batch.lane] += int(counts.sum())
        if time.monotonic() - last > 10:
            last = time.monotonic()
            done = min(int(at.min()) * LANES, total)
            rate = max(done, 1) / (last - start)
            eta = (total - done) / rate
            logging.info("%d of %d tokens, %.0f tokens/s, ETA %.0fs", done, total, rate, eta)
        if int(at.min()) * LANES >= total:
            break
    pipeline.close()
    return segments, np.array(rows), time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4_000_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    total = args.tokens - args.tokens % SEGMENT
    with tempfile.TemporaryDirectory() as tmp:
        segments, rows, seconds = measure(tmp, total)
    lane = Schedule(SCHEDULE, NAMES).for_lane(1)
    lines = [
        f"# Scheduled mixture: target vs realized token shares ({platform.node()}, "
        f"{time.strftime('%Y-%m-%d')}); {LANES} lanes, rows of {MAX_LENGTH + 1}, shuffle {SHUFFLE} rows, "
        f"{total:,} tokens in {seconds:.0f}s",
        "# python benchmarks/schedule.py",
        f"{'segment (run tokens)':>24} "
        + " ".join(f"{n + ' target':>16} {n:>9}" for n in NAMES)
        + "  max |diff|",
    ]
    worst = 0.0
    for i, counts in enumerate(segments):
        a, b = i * SEGMENT, (i + 1) * SEGMENT
        target = [(lane.target(d, b) - lane.target(d, a)) / SEGMENT for d in range(len(NAMES))]
        realized = counts / counts.sum()
        diff = float(np.max(np.abs(realized - target)))
        worst = max(worst, diff)
        cells = " ".join(f"{t:>16.4f} {r:>9.4f}" for t, r in zip(target, realized, strict=True))
        lines.append(f"{f'[{a:,}, {b:,})':>24} {cells}  {diff:.4f}")
    lines.append(f"largest difference in any segment: {worst:.4f}")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "schedule.txt"), "w") as f:
        f.write(text)
    plot(rows, lane, total)


def plot(rows: np.ndarray, lane, total: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = np.argsort(rows[:, 0], kind="stable")
    position, counts = rows[order, 0], rows[order, 1:]
    width = 200  # rows in the moving window (about 400k run tokens)
    kernel = np.ones(width)
    smooth = np.stack([np.convolve(counts[:, d], kernel, "valid") for d in range(len(NAMES))], 1)
    shares = smooth / smooth.sum(1, keepdims=True)
    x = position[width - 1 :]
    grid = np.linspace(0, total, 400)
    fig, ax = plt.subplots(figsize=(8, 4))
    for d, name in enumerate(NAMES):
        line = ax.plot(grid / 1e6, [lane.weights(g)[d] for g in grid], "--", lw=1)[0]
        ax.plot(x / 1e6, shares[:, d], color=line.get_color(), lw=1.5, label=name)
    ax.set_xlabel("run position (million delivered tokens)")
    ax.set_ylabel("token share")
    ax.set_title(f"Scheduled mixture: target (dashed) vs realized (moving {width} rows)", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "results", "schedule.png"), dpi=120)


if __name__ == "__main__":
    main()
