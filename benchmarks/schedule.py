#!/usr/bin/env python
"""A scheduled mixture over a run: target against realized token shares, on real text.

KJV chapters, whole Python standard-library files (many far longer than a row) and KJV verses,
GPT-2 BPE, 8 lanes, rows of 2,049 tokens, 4M delivered tokens, without a shuffle and with one of
16 rows per lane (it permutes rows within a window of 16 x 2,049 x 8 = 262k run tokens). The
schedule (in the run's delivered tokens): verses .6 / chapters .3 / code .1 from the start; a
step at 1M to .2 / .3 / .5; a linear ramp from 2M to 3M to .1 / .7 / .2; then that holds.

A delivered row counts at the run's position the schedule uses: the tokens its lane delivered
before it times the number of lanes. Shares are measured per segment of 250k tokens (what the
schedule asks for over the segment is the integral of its weights). A shuffle spreads a change of
the schedule over one window: what a demanding schedule needs is windows short next to its steps. Writes
benchmarks/results/schedule.txt and .png.

    python benchmarks/schedule.py [--tokens 4000000]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import platform
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # benchmarks.common, from a source checkout

from benchmarks.common import result_path, write_result  # noqa: E402
from zephon import Dataset, Pipeline, ScheduledMixtureWorkSource  # noqa: E402
from zephon.testing import gpt2_tokenizer_dir, write_jsonl, write_parquet  # noqa: E402
from zephon.testing.data import kjv_grouped, kjv_records, python_source_documents  # noqa: E402
from zephon.work import Schedule  # noqa: E402

LANES, MAX_LENGTH, SEGMENT = 8, 2048, 250_000
SHUFFLES = (0, 16)  # rows per lane: none, and 16 (a window of 262k run tokens)
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


def measure(tmp: str, total: int, shuffle: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Tokens per dataset in each segment, per-row (position, dataset counts), and seconds."""
    source = ScheduledMixtureWorkSource(datasets(tmp), SCHEDULE, unit="tokens", seed=1)
    pipeline = Pipeline(source).options(num_lanes=LANES).tokenize(gpt2_tokenizer_dir(tmp), parallelism=2)
    pipeline = pipeline.pack_flat(MAX_LENGTH)
    pipeline = (pipeline.shuffle(shuffle, seed=2) if shuffle else pipeline).batch(8)
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
        runs = {shuffle: measure(tmp, total, shuffle) for shuffle in SHUFFLES}
    lane = Schedule(SCHEDULE, NAMES).for_lane(1)
    changes = [p["at"] for p in SCHEDULE[1:]]
    window = SHUFFLES[1] * (MAX_LENGTH + 1) * LANES
    lines = [
        f"# Scheduled mixture: target vs realized token shares ({platform.node()}, "
        f"{time.strftime('%Y-%m-%d')}); {LANES} lanes, rows of {MAX_LENGTH + 1}, {total:,} tokens; "
        + ", ".join(f"shuffle {k}: {v[2]:.0f}s" for k, v in runs.items()),
        "# python benchmarks/schedule.py",
        f"# realized: without a shuffle | with a shuffle of {SHUFFLES[1]} rows per lane (a window is "
        f"{window:,} run tokens; * marks segments within one window of a change of the schedule)",
        f"{'segment (run tokens)':>24} " + " ".join(f"{n:>24}" for n in NAMES) + "   max |diff|",
        f"{'':>24} " + " ".join(f"{'target  none  shuffled':>24}" for _ in NAMES),
    ]
    worst = {k: 0.0 for k in SHUFFLES}
    worst_away = 0.0
    for i in range(total // SEGMENT):
        a, b = i * SEGMENT, (i + 1) * SEGMENT
        near = any(a - window < c < b + window for c in changes)
        target = np.array([(lane.target(d, b) - lane.target(d, a)) / SEGMENT for d in range(len(NAMES))])
        realized = {k: v[0][i] / v[0][i].sum() for k, v in runs.items()}
        diffs = {k: float(np.max(np.abs(r - target))) for k, r in realized.items()}
        for k in SHUFFLES:
            worst[k] = max(worst[k], diffs[k])
        if not near:
            worst_away = max(worst_away, diffs[SHUFFLES[1]])
        cells = " ".join(
            f"{t:>8.3f} {realized[SHUFFLES[0]][d]:>6.3f} {realized[SHUFFLES[1]][d]:>8.3f}"
            for d, t in enumerate(target)
        )
        span = f"[{a:,}, {b:,})" + ("*" if near else " ")
        lines.append(f"{span:>24} {cells}   {diffs[SHUFFLES[0]]:.4f} | {diffs[SHUFFLES[1]]:.4f}")
    lines += ["", "# per segment of the schedule (between its points)"]
    bounds = [*(p["at"] for p in SCHEDULE), total]
    for a, b in itertools.pairwise(bounds):
        if a == b:
            continue
        target = np.array([(lane.target(d, b) - lane.target(d, a)) / (b - a) for d in range(len(NAMES))])
        cells = []
        for k, (segments, _, _) in runs.items():
            counts = segments[a // SEGMENT : b // SEGMENT].sum(0)
            diff = float(np.max(np.abs(counts / counts.sum() - target)))
            cells.append(f"shuffle {k}: max |diff| {diff:.4f}")
        lines.append(f"{f'[{a:,}, {b:,})':>24}  target {np.round(target, 4).tolist()}  " + ", ".join(cells))
    lines += [
        "",
        f"largest |realized - target| in any 250k segment, without a shuffle: {worst[SHUFFLES[0]]:.4f}",
        f"with a shuffle of {SHUFFLES[1]} rows: {worst[SHUFFLES[1]]:.4f} in all segments, "
        f"{worst_away:.4f} in those more than one window from a change",
    ]
    write_result("schedule.txt", lines)
    plot(runs, lane, total)


def plot(runs: dict, lane, total: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 100  # rows in the moving window (about 200k run tokens)
    grid = np.linspace(0, total, 400)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (shuffle, (_, rows, _)) in zip(axes, runs.items(), strict=True):
        order = np.argsort(rows[:, 0], kind="stable")
        position, counts = rows[order, 0], rows[order, 1:]
        kernel = np.ones(width)
        smooth = np.stack([np.convolve(counts[:, d], kernel, "valid") for d in range(len(NAMES))], 1)
        shares = smooth / smooth.sum(1, keepdims=True)
        x = position[width // 2 : width // 2 + len(shares)]
        for d, name in enumerate(NAMES):
            line = ax.plot(grid / 1e6, [lane.weights(g)[d] for g in grid], "--", lw=1)[0]
            ax.plot(x / 1e6, shares[:, d], color=line.get_color(), lw=1.5, label=name)
        ax.set_title(f"shuffle: {shuffle or 'none'}" + (" rows per lane" if shuffle else ""), fontsize=10)
        ax.set_xlabel("run position (million delivered tokens)")
    axes[0].set_ylabel("token share")
    axes[0].legend()
    fig.suptitle(f"Scheduled mixture: target (dashed) vs realized (moving {width} rows)", fontsize=11)
    fig.tight_layout()
    fig.savefig(result_path("schedule.png"), dpi=120)


if __name__ == "__main__":
    main()
