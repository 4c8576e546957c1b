#!/usr/bin/env python
"""Attention cost balance across ranks with document masks, simulated from the stream.

With per-document masks a row's attention cost is the causal query-key pairs of its documents,
``n (n + 1) / 2`` for a document of ``n`` tokens (zephon.ops.balance.attention_cost), so the
ranks of one step do unequal work. The job is train_configs/llama3_8b.toml's: rows of 8192
tokens, 512 lanes, 1 row a microbatch, global batch 1024 (2 batches of every lane a step),
shuffle buffer 256, wrap packing; real text with GPT-2 BPE. A rank's cost in a step is the sum
over its lanes' batches of the step (rank r of D owns lanes [r*512/D, (r+1)*512/D)); the table
shows the slowest rank's cost over the mean, per step: its mean and its worst step over the
simulated steps, and its mean over the steps of the last window (the first windows of a lane are
small: 1, 2, 4 ... rows; steps 64-127 are one window of 128 rows), at 8, 64 and 512 ranks, for
three mixtures of real text:

- KJV verses alone (tiny documents);
- the throughput benchmark's three datasets: KJV verses .40, KJV chapters .35, whole Python
  standard-library files .25 (token shares);
- long documents: KJV chapters .50, Python files .50.

"balanced" is the same stream with ``batch(balance_attention=True)``: each window's rows in the
order of zephon.ops.balance, computed here from the recorded rows of each window (the lanes of
the first 8 are also run through the pipeline with the option, and must give the same costs).
No GPU, no model: the stream only. Writes benchmarks/results/attention_balance.txt and .png.

    python benchmarks/attention_balance.py [--steps 127]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks.common
from benchmarks.common import MIXTURE
from zephon import Dataset, MixtureWorkSource, Pipeline
from zephon.ops.balance import attention_cost, balanced_order
from zephon.testing import gpt2_tokenizer_dir
from zephon.testing.data import real_text_corpora

HERE = os.path.dirname(os.path.abspath(__file__))
LANES, SEQ_LEN, PER_LANE, SHUFFLE = 512, 8192, 2, 256
RANKS = (8, 64, 512)
GROUP = 64  # lanes simulated at a time (one pipeline), to bound memory
MIXTURES = {
    "KJV verses": {"verses": 1.0},
    "three datasets": MIXTURE,
    "long documents": {"chapters": 0.50, "code": 0.50},
}


def make(corpora, tokenizer, mixture, rank, balance=False) -> Pipeline:
    datasets = [Dataset.from_path(n, corpora[n][0], exhausted="repeat") for n in mixture]
    source = MixtureWorkSource(datasets, mixture, unit="tokens", seed=0)
    # chunk_bytes: the default at 512 lanes cuts the code file into chunks that hold no line start
    options = dict(num_lanes=LANES, chunk_bytes=1 << 18, runner="inline")
    return (
        Pipeline(source)
        .options(dp_rank=rank, dp_world_size=LANES // GROUP, **options)
        .tokenize(tokenizer, parallelism=1)
        .pack_flat(SEQ_LEN)
        .shuffle(SHUFFLE, seed=0)
        .batch(1, balance_attention=balance)
    )


def whole_windows(pipeline: Pipeline, rows: int) -> int:
    """Rows of a lane's windows up to the one that holds its ``rows``-th row."""
    ops, total, window = pipeline.spec().lane_ops(), 0, 0
    while total < rows:
        total, window = total + ops.rows_in(window), window + 1
    return total


def lane_costs(pipeline: Pipeline, rows: int) -> dict[int, list[int]]:
    """Each of the pipeline's lanes' batch costs, in the order delivered, ``rows`` of each."""
    want = len(pipeline.owned_lanes) * rows
    out: dict[int, list[int]] = {}
    for i, batch in enumerate(pipeline):
        out.setdefault(batch.lane, []).append(int(attention_cost(batch.positions).sum()))
        if i + 1 == want:
            break
    pipeline.close()
    return out


def balanced(costs: list[int], pipeline: Pipeline) -> list[int]:
    """The same rows in balance_attention's order: each window reordered on its own."""
    ops, out, window = pipeline.spec().lane_ops(), [], 0
    while len(out) < len(costs):
        rows = costs[len(out) : len(out) + ops.rows_in(window)]
        out += [rows[i] for i in balanced_order(np.asarray(rows))]
        window += 1
    return out


def spread(costs: dict[int, list[int]], steps: int) -> dict[int, np.ndarray]:
    """Ranks -> the slowest rank's cost over the mean, per step."""
    rows = steps * PER_LANE
    per_step = np.array(
        [np.asarray(costs[lane][:rows]).reshape(steps, PER_LANE).sum(1) for lane in range(LANES)]
    )
    out = {}
    for ranks in RANKS:
        by_rank = per_step.reshape(ranks, LANES // ranks, steps).sum(1)
        out[ranks] = by_rank.max(0) / by_rank.mean(0)
    return out


def simulate(corpora, tokenizer, mixture, steps) -> tuple[dict, dict, float]:
    plain, balanced_costs, start = {}, {}, time.monotonic()
    for rank in range(LANES // GROUP):
        pipeline = make(corpora, tokenizer, mixture, rank)
        rows = whole_windows(pipeline, steps * PER_LANE)  # whole windows, so that each can be reordered
        got = lane_costs(pipeline, rows)
        plain.update(got)
        balanced_costs.update({lane: balanced(c, pipeline) for lane, c in got.items()})
        if rank == 0:  # the option itself, through the pipeline: the same costs
            real = lane_costs(make(corpora, tokenizer, mixture, 0, balance=True), rows)
            assert real == {lane: balanced_costs[lane] for lane in real}, "the offline order differs"
    return spread(plain, steps), spread(balanced_costs, steps), time.monotonic() - start


def draw(results: dict, steps: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.4), sharey=True)
    for ax, (name, (plain, even)) in zip(axes, results.items(), strict=True):
        x = np.arange(1, steps + 1)
        for ranks, color in zip(RANKS, ("tab:green", "tab:orange", "tab:red"), strict=True):
            ax.plot(x, plain[ranks], color=color, label=f"{ranks} ranks")
            ax.plot(x, even[ranks], color=color, linestyle="--", label=f"{ranks} ranks, balanced")
        ax.axhline(1.10, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(name)
        ax.set_xlabel("step")
    axes[0].set_ylabel("slowest rank's attention cost / mean")
    axes[0].legend(fontsize=7)
    fig.suptitle("Per-document attention cost across ranks (rows of 8192, 512 lanes, 2 rows a lane a step)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=127)  # windows of 1 to 128 rows
    args = parser.parse_args()
    results, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        corpora = real_text_corpora(tmp)
        tokenizer = gpt2_tokenizer_dir(os.path.join(tmp, "gpt2"))
        for name, mixture in MIXTURES.items():
            plain, even, took = simulate(corpora, tokenizer, mixture, args.steps)
            results[name], seconds[name] = (plain, even), took
            print(name, {r: round(float(plain[r].mean()), 3) for r in RANKS}, f"[{took:.0f}s]", flush=True)
    last = (args.steps + 1) // 2  # the steps of the lanes' last window (whole when steps = 2^k - 1)
    every, tail = f"steps 1-{args.steps}", f"steps {last + 1}-{args.steps}"
    lines = [
        "Attention cost across ranks with per-document masks: the slowest rank's cost over the mean,",
        f"per step: over {every}, its mean / worst step; over {tail} (the lanes'",
        "last window), its mean. Cost of a row: causal pairs per document, n (n + 1) / 2. Job: rows of",
        "8192 tokens, 512 lanes, 1 row a microbatch, global batch 1024 (2 batches of every lane a",
        "step), shuffle 256, wrap packing, GPT-2 BPE; real text. balanced: the same rows with",
        "batch(balance_attention=True) ([packing] balance_attention = true).",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}.",
        f"Command: python benchmarks/attention_balance.py --steps {args.steps}",
        "",
        f"{'':<22} {'max/mean, ' + every:>28}  {tail:>18}",
        f"{'mixture':<16} {'ranks':>5} {'plain':>13} {'balanced':>14}  {'plain':>8} {'balanced':>9}",
    ]
    for name, (plain, even) in results.items():
        for ranks in RANKS:
            a, b = plain[ranks], even[ranks]
            lines.append(
                f"{name:<16} {ranks:>5} {a.mean():>5.3f} / {a.max():.3f} {b.mean():>6.3f} / {b.max():.3f}"
                f"  {a[last:].mean():>8.3f} {b[last:].mean():>9.3f}"
            )
    lines += [
        "",
        "Windows double from 1 row to 256 (the shuffle buffer): early steps draw on small windows,",
        "where balancing has few rows to pair (the worst steps are there); later windows hold 256.",
        "Balanced steps cost most near a window's end, where the rows hardest to pair are left.",
        "At 512 ranks a rank holds 2 rows a step, one lane's: a row of one long document costs up to",
        "4x the mean row, and no order of a lane's rows pairs it down to the mean; lanes are",
        "independent streams, so their windows' means differ too (1.11 at 512 ranks in the last",
        "window of the three datasets, were every step of a lane at its window's mean).",
        "Simulation times: " + ", ".join(f"{n} {s:.0f} s" for n, s in seconds.items()) + ".",
    ]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(HERE, "results", "attention_balance.txt"), "w") as f:
        f.write(text)
    draw(results, args.steps, os.path.join(HERE, "results", "attention_balance.png"))
    print(text)


if __name__ == "__main__":
    main()
