#!/usr/bin/env python
"""Where an inline lane's time goes, part by part, and what the native parts alone would allow.

The throughput benchmark's recipe (``benchmarks/peers/zephon_self.py``, inline, the default
fastokens backend) over its real text, each dataset written ``--copies`` times: the chunk work
(read, parse, tokenize) and each of its calls into compiled code are timed where they run; the
rest of the chunk work is its time less those calls, and the rest of the run (the lane's mixing,
packing, batches and the benchmark's loop) the wall time less the chunk work.
Seconds per million tokens delivered, medians of ``--reps`` runs, each a new pipeline after one
run that loads the tokenizer (so its load, and the reference tokenizer's first chunks, are left
out).

The native floor: the parts that are one call into compiled code (the tokenizer, msgspec, the
digest, the read, the documents' layout) add up to what a lane that did nothing else would take;
its inverse bounds one inline lane's tokens/s however its Python is written. ``lane_cost.py``
measures the lane's own work alone, over kept chunk results.

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

CHUNK_WORK = ("zephon.lanes", "ChunkWork.__call__")
# the chunk work's calls into compiled code: (label, module, attribute)
NATIVE = [
    ("read: the chunk's lines from its file", "zephon.io.formats.lines", "_owned_lines"),
    ("read: content digest (XXH3-64)", "zephon.io.formats.lines", "content_digest"),
    ("read: each line one object, the check (_lines.c)", "zephon.io.formats.lines", "_objects_per_line"),
    ("read: JSON lines, msgspec", "zephon.io.formats.lines", "_LINES"),
    ("tokenize: the tokenizer's call", "zephon.io.fast_tokenizer", "_flat"),
    ("tokenize: documents laid out, BOS/EOS and places (_docs.c)", "zephon.ops.tokenize", "_lay_out"),
]
WHOLE = "chunk work, all of it"


def _wrap(totals: dict, label: str, module: str, attribute: str) -> None:
    import importlib

    owner = importlib.import_module(module)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    inner = getattr(owner, name)
    if inner is None:  # a compiled part (setup.py) not built
        raise SystemExit(f"{module}.{attribute} is not built: pip install -e . where a C compiler is present")

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
    for label, module, attribute in [(WHOLE, *CHUNK_WORK), *NATIVE]:
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
            missing = [label for label in (WHOLE, *(part[0] for part in NATIVE)) if label not in totals]
            if missing:
                raise RuntimeError(f"not timed (renamed, or not run?): {missing}")
            per_m = {label: seconds / n * 1e6 for label, seconds in totals.items()}
            per_m["wall"] = wall / n * 1e6
            runs.append(per_m)
            print(f"rep {rep + 1}/{reps}: {n / wall / 1e6:.2f}M tokens/s", flush=True)
    return runs


def report(runs: list[dict], args) -> list[str]:
    med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    wall, chunk = med["wall"], med[WHOLE]
    native = sum(med[label] for label, _, _ in NATIVE)
    rows = [(f"{label} (native)", med[label]) for label, _, _ in NATIVE]
    rows += [
        ("the rest of the chunk work: checks, fields, lengths, bookkeeping", chunk - native),
        ("outside the chunk work: mixing, packing, batches, the loop", wall - chunk),
    ]
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
    lines += [f"| {label} | {seconds * 1e3:.2f} | {seconds / wall:.1%} |" for label, seconds in rows]
    lines += [
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
    parser.add_argument("--out", default="chunk_cost", help="results file name, .md added")
    args = parser.parse_args()
    refuse_fewer_than_one_copy(parser, args.copies)
    if args.tokens < 1 or args.reps < 1:
        parser.error("--tokens and --reps: 1 or more")
    write_result(f"{args.out}.md", report(measure(args.tokens, args.reps, args.copies), args))


if __name__ == "__main__":
    main()
