#!/usr/bin/env python
"""How the cores are shared: fastokens' own threads against the runners' workers.

Inline (no workers) fastokens spreads each call over threads of its own, one per core; the thread
and process runners give each worker one tokenizing thread (``FASTOKENS_BPE_THREADS=1``) and the
lane thread packs. This runs the throughput benchmark's pipeline (``benchmarks/peers/zephon_self.py``:
the three-dataset token mixture, GPT-2 BPE, 8 lanes, fastokens) on its real text written
``--copies`` times over, until ``--tokens`` tokens are delivered, in these configurations, each
run in a fresh process, the configurations interleaved ``--reps`` times:

- inline, fastokens with its own threads (the default);
- inline, fastokens on one thread (``FASTOKENS_BPE_THREADS=1``): what its threads are worth;
- two thread workers, and the same with Python's GIL switch interval at 1 ms instead of 5 ms
  (``sys.setswitchinterval``): whether the workers and the lane thread wait on each other's turns;
- two process workers.

Reports medians of tokens/s end to end and after the first batch, and the CPU the run's own
process used (process workers' CPU is theirs, not counted). Writes
``benchmarks/results/core_sharing.txt``.

    python benchmarks/core_sharing.py [--tokens 40000000] [--reps 3] [--copies 16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONE_THREAD = {"FASTOKENS_BPE_THREADS": "1", "RAYON_NUM_THREADS": "1"}
# name: (runner, workers, environment, GIL switch interval or None)
CONFIGS = {
    "inline": ("inline", 1, {}, None),
    "inline, one fastokens thread": ("inline", 1, ONE_THREAD, None),
    "thread x2": ("thread", 2, {}, None),
    "thread x2, switch interval 1 ms": ("thread", 2, {}, 0.001),
    "process x2": ("process", 2, {}, None),
}  # fmt: skip


def child(name: str, tokens: int, copies: int) -> None:
    """One run, in this fresh process: prints its rates as JSON."""
    runner, workers, _, interval = CONFIGS[name]
    if interval is not None:
        sys.setswitchinterval(interval)
    from benchmarks.common import text_setup
    from benchmarks.peers import zephon_self

    with tempfile.TemporaryDirectory() as tmp:
        setup = text_setup(tmp, copies, method=runner, workers=workers, options={"backend": "auto"})
        start, cpu = time.perf_counter(), time.process_time()
        p = zephon_self.pipeline(setup)
        done, first = 0, None
        try:
            for batch in p:
                done += int((batch.sources >= 0).sum())
                first = first or time.perf_counter()
                if done >= tokens:
                    break
        finally:
            p.close()
        end = time.perf_counter()
    record = {"tokens": done, "rate": done / (end - start), "steady": done / (end - first)}
    record["cpu"] = time.process_time() - cpu
    print(json.dumps(record), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=40_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--copies", type=int, default=16)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)  # benchmarks.common and benchmarks.peers, from a source checkout
    from benchmarks.common import compile_project, in_fresh_process, refuse_fewer_than_one_copy, write_result

    refuse_fewer_than_one_copy(parser, args.copies)
    if args.tokens < 1 or args.reps < 1:
        parser.error(f"--tokens {args.tokens} --reps {args.reps}: give 1 or more of each")
    if args.child:
        child(args.child, args.tokens, args.copies)
        return
    compile_project()
    runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    began = time.monotonic()
    for rep in range(args.reps):
        for name, (_, _, env, _) in CONFIGS.items():
            argv = ["--child", name, "--tokens", str(args.tokens), "--copies", str(args.copies)]
            run = in_fresh_process(__file__, argv, name, timeout=1200, env=dict(os.environ, **env))
            if run is None:
                sys.exit(f"core_sharing: the run {name!r} failed (above); nothing written")
            runs[name].append(run)
            done = sum(len(v) for v in runs.values())
            left = (time.monotonic() - began) / done * (args.reps * len(CONFIGS) - done)
            rate = run["rate"] / 1e6
            print(f"rep {rep + 1}/{args.reps} {name}: {rate:.2f}M tokens/s; about {left:.0f} s left")

    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[name])

    inline = median("inline", "rate")
    lines = [
        "# How the cores are shared: fastokens' own threads against the runners' workers",
        "",
        "`python benchmarks/core_sharing.py "
        f"--tokens {args.tokens} --reps {args.reps} --copies {args.copies}` "
        f"on {platform.machine()}, {os.cpu_count()} CPUs: the throughput benchmark's pipeline "
        "(fastokens, 8 lanes) on its real text written over as a corpus, each run in a fresh process, "
        f"the configurations interleaved; medians of {args.reps}.",
        "",
        "| configuration | tokens/s end to end | vs inline | after the first batch | CPU, run's process |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in CONFIGS:
        rate, steady, cpu = median(name, "rate"), median(name, "steady"), median(name, "cpu")
        row = f"| {name} | {rate / 1e6:.2f}M | {rate / inline:.2f}x | {steady / 1e6:.2f}M | {cpu:.1f} s |"
        lines.append(row)
    lines += ["", "Every run, tokens/s end to end (M), in the order run:"]
    for name in CONFIGS:
        lines.append(f"- {name}: " + ", ".join(f"{run['rate'] / 1e6:.2f}" for run in runs[name]))
    write_result("core_sharing.txt", lines)


if __name__ == "__main__":
    main()
