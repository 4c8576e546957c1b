#!/usr/bin/env python
"""Where an inline lane's time goes, part by part, and what the native parts alone would allow.

The throughput benchmark's recipe (``benchmarks/peers/zephon_self.py``, inline, the default
fastokens backend) over its real text, each dataset written ``--copies`` times: every part of a
chunk's work is timed where it runs (reading the lines, the content digest, msgspec's reader and
the checks around it, the tokenizer's call, BOS/EOS and positions), and the rest of the run (the
lane's mixing, packing, batches and the benchmark's loop) is the wall time less the chunk work.
Seconds per million tokens delivered, medians of ``--reps`` runs, each a new pipeline after one
run that loads the tokenizer (so its load, and the reference tokenizer's first chunks, are left
out).

The native floor: the parts that are one call into compiled code (the tokenizer, msgspec, the
digest, the read) add up to what a lane that did nothing else would take; its inverse bounds one
inline lane's tokens/s however its Python is written. ``lane_cost.py`` measures the lane's own
work alone, over kept chunk results.

    python benchmarks/chunk_cost.py [--tokens 30000000 --reps 5 --copies 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
from benchmarks.common import refuse_fewer_than_one_copy, write_result  # noqa: E402

# (label, module, attribute, whether it is one call into compiled code)
PARTS = [
    ("chunk work (all of it)", "zephon.lanes", "ChunkWork.__call__", False),
    ("  read: the chunk's lines from its file", "zephon.io.formats.lines", "_owned_lines", True),
    ("  read: content digest (SHA-256)", "zephon.io.formats.lines", "content_digest", True),
    ("  read: JSON lines, msgspec", "zephon.io.formats.lines", "_LINES", True),
    ("  read: JSON lines, checks around it", "zephon.io.formats.lines", "_whole_chunk", False),
    ("  tokenize: the tokenizer's call", "zephon.io.fast_tokenizer", "_flat", True),
    ("  tokenize: BOS/EOS laid out", "zephon.ops.tokenize", "_with_special", False),
    ("  tokenize: token positions", "zephon.ops.containers", "Docs.token_positions", False),
]


def _wrap(totals: dict, label: str, module: str, attribute: str) -> None:
    import importlib

    owner = importlib.import_module(module)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    inner = getattr(owner, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[label] = totals.get(label, 0.0) + time.perf_counter() - start

    setattr(owner, name, timed)


def measure(tokens: int, reps: int, copies: int) -> list[dict]:
    from benchmarks.common import text_setup
    from benchmarks.peers import zephon_self

    totals: dict[str, float] = {}
    for label, module, attribute, _ in PARTS:
        _wrap(totals, label, module, attribute)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        setup = text_setup(tmp, copies, method="inline", workers=1, options={"backend": "auto"})

        def run(limit: int) -> tuple[int, float]:
            n, start = 0, time.perf_counter()
            for out in zephon_self.batches(setup):
                n += int(out.valid.sum())
                if n >= limit:
                    break
            return n, time.perf_counter() - start

        run(2_000_000)  # the tokenizer loaded and probed: its start is not what this measures
        for rep in range(reps):
            totals.clear()
            n, wall = run(tokens)
            per_m = {label: seconds / n * 1e6 for label, seconds in totals.items()}
            per_m["wall"] = wall / n * 1e6
            runs.append(per_m)
            print(f"rep {rep + 1}/{reps}: {n / wall / 1e6:.2f}M tokens/s", flush=True)
    return runs


def report(runs: list[dict], args) -> list[str]:
    med = {key: statistics.median(r.get(key, 0.0) for r in runs) for key in runs[0]}
    wall, chunk = med["wall"], med[PARTS[0][0]]
    whole_chunk = med["  read: JSON lines, checks around it"]
    med["  read: JSON lines, checks around it"] = whole_chunk - med["  read: JSON lines, msgspec"]
    native = sum(med[label] for label, _, _, is_native in PARTS if is_native)
    lines = [
        "# An inline lane's time, part by part",
        "",
        f"`python benchmarks/chunk_cost.py --tokens {args.tokens} --reps {args.reps} --copies {args.copies}` "
        f"on {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}: the "
        "throughput benchmark's recipe, inline, fastokens, each part timed where it runs; medians of "
        f"{args.reps} runs after one that loads the tokenizer. Run: {1 / wall:.2f}M tokens/s.",
        "",
        "| part | ms per M tokens | share of the run |",
        "|---|---:|---:|",
    ]
    for label, _, _, is_native in PARTS:
        mark = " (native)" if is_native else ""
        lines.append(f"| {label.strip()}{mark} | {med[label] * 1e3:.2f} | {med[label] / wall:.1%} |")
    rest = wall - chunk
    lines += [
        f"| the rest: mixing, packing, batches, the loop | {rest * 1e3:.2f} | {rest / wall:.1%} |",
        f"| **the run** | **{wall * 1e3:.2f}** | 100% |",
        "",
        f"The native parts alone: {native * 1e3:.2f} ms per M tokens, so one inline lane delivers at most "
        f"{1 / native:.1f}M tokens/s however little Python it runs (it ran at {1 / wall:.2f}M).",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=30_000_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--out", default="chunk_cost")
    args = parser.parse_args()
    refuse_fewer_than_one_copy(parser, args.copies)
    if args.tokens < 1 or args.reps < 1:
        parser.error("--tokens and --reps: 1 or more")
    write_result(args.out, report(measure(args.tokens, args.reps, args.copies), args))


if __name__ == "__main__":
    main()
