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

Then why thread workers gain so little: turns on the GIL, measured alone. fastokens releases the
GIL while it encodes, and must take it back to return; a thread that runs Python (the lane thread)
keeps it until it waits or until Python's switch interval (5 ms by default) makes it give it up.
In a fresh process, the same texts (the corpus, in calls of a chunk's size, about 64 KiB of text
each) are encoded on one fastokens thread alone, then beside a thread that only runs Python, at
switch intervals of 5, 1 and 0.2 ms: the encoding's wall and CPU seconds, and how far the Python
thread got against the same thread alone.

Reports medians of tokens/s end to end and after the first batch, and the CPU the run's own
process used (process workers' CPU is theirs, not counted); then, over the run's second half of
tokens (from half the tokens, once the process workers are up), the CPU seconds a million tokens of the run's
process and of its workers (the fork server's children, from ``/proc`` through psutil), and the
cores they kept busy: what bounds each runner. Writes ``benchmarks/results/core_sharing.txt``.

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
import threading
import time
from collections.abc import Callable
from typing import Any

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
        done, first, half, looked = 0, None, None, 0.0
        # the second half begins at half the tokens, once the process workers are up (until then
        # the rank process runs their units), looked for at most every 50 ms
        workers_up = workers if runner == "process" else 0
        try:
            for batch in p:
                done += int((batch.sources >= 0).sum())
                now = time.perf_counter()
                first = first or now
                if half is None and done >= tokens // 2 and now - looked >= 0.05:
                    looked, seconds = now, _cpu_seconds()
                    if len(seconds) - 1 >= workers_up:
                        half = (done, now, seconds)
                if done >= tokens:
                    break
            later = (done, time.perf_counter(), _cpu_seconds())
        finally:
            p.close()
        end = time.perf_counter()
    record = {"tokens": done, "rate": done / (end - start), "steady": done / (end - first)}
    record["cpu"] = time.process_time() - cpu
    if half is not None and later[0] > half[0]:  # (else the workers came up too late to measure)
        record.update(_second_half(half, later))
    print(json.dumps(record), flush=True)


def _cpu_seconds() -> dict[int, float]:
    """CPU seconds (user and system) so far: this process's under 0, and each of its workers'
    under its PID (a process whose parent is not this one: the fork server's children; the fork
    server itself, which only forks them, and multiprocessing's resource tracker are left out)."""
    import psutil

    me = psutil.Process()
    seconds = {0: sum(me.cpu_times()[:2])}
    for child in me.children(recursive=True):
        try:
            if child.ppid() != me.pid:
                seconds[child.pid] = sum(child.cpu_times()[:2])
        except psutil.Error:  # ended meanwhile
            pass
    return seconds


def _second_half(half: tuple, later: tuple) -> dict:
    """Tokens/s, and CPU ms a million tokens of the run's process and of its workers, between
    ``half`` and ``later`` (each: tokens done, time, ``_cpu_seconds()``); a worker started in
    between counts from its start."""
    (tokens0, t0, cpu0), (tokens1, t1, cpu1) = half, later
    millions = (tokens1 - tokens0) / 1e6
    workers = sum(seconds - cpu0.get(pid, 0.0) for pid, seconds in cpu1.items() if pid)
    return {
        "half_rate": (tokens1 - tokens0) / (t1 - t0),
        "half_own_ms": (cpu1[0] - cpu0[0]) / millions * 1e3,
        "half_workers_ms": workers / millions * 1e3,
    }


TURNS_INTERVALS = (0.005, 0.001, 0.0002)  # seconds: Python's default switch interval, and less
CALL_CHARS = 64 << 10  # text per encode call: about one chunk of the throughput benchmark's
PYTHON_ALONE = 1.0  # seconds the Python thread runs alone, for its own pace


def turns() -> None:
    """The encoding alone and beside a thread running Python, in this fresh process (one fastokens
    thread): prints JSON."""
    import fastokens

    from benchmarks.common import text_setup

    with tempfile.TemporaryDirectory() as tmp:
        setup = text_setup(tmp)
        texts = []
        for path in setup.files.values():
            with open(path) as f:
                texts += [json.loads(line)["text"] for line in f]
        tok = fastokens.Tokenizer.from_file(setup.tokenizer_json)
    calls, call, size = [], [], 0
    for text in texts:
        call.append(text)
        size += len(text)
        if size >= CALL_CHARS:
            calls.append(call)
            call, size = [], 0
    calls = [*calls, call] * 3
    tok.encode_batch_flat(calls[0])  # its first call builds what it keeps

    def encode() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()
        for texts_of_a_call in calls:
            tok.encode_batch_flat(texts_of_a_call)
        return time.perf_counter() - wall, time.thread_time() - cpu

    def beside_python(during: Callable[[], Any]) -> tuple[Any, int]:
        """``during()`` run beside a thread that only counts, in Python (holding the GIL but at
        the interpreter's switches): its result, and how far the thread counted meanwhile."""
        stop: list = []

        def count() -> None:
            n = 0
            while not stop:
                n += 1
            stop.append(n)

        thread = threading.Thread(target=count)
        thread.start()
        out = during()
        stop.append(None)
        thread.join()  # it ends at its next count
        return out, stop[-1]

    alone_wall, alone_cpu = encode()
    _, counted = beside_python(lambda: time.sleep(PYTHON_ALONE))
    python_alone = counted / PYTHON_ALONE
    record = {"alone": [alone_wall, alone_cpu], "calls": len(calls), "chars": sum(map(len, texts))}
    for interval in TURNS_INTERVALS:
        sys.setswitchinterval(interval)
        (wall, cpu), counted = beside_python(encode)
        record[str(interval)] = [wall, cpu, counted / wall / python_alone]
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
    from benchmarks.common import (
        compile_project,
        in_fresh_process,
        interleaved,
        refuse_fewer_than_one_copy,
        write_result,
    )

    refuse_fewer_than_one_copy(parser, args.copies)
    if args.tokens < 1 or args.reps < 1:
        parser.error(f"--tokens {args.tokens} --reps {args.reps}: give 1 or more of each")
    if args.child == "turns":
        turns()
        return
    if args.child:
        child(args.child, args.tokens, args.copies)
        return
    compile_project()

    def measure(name: str) -> dict | None:
        argv = ["--child", name, "--tokens", str(args.tokens), "--copies", str(args.copies)]
        return in_fresh_process(__file__, argv, name, timeout=1200, env=dict(os.environ, **CONFIGS[name][2]))

    def said(name: str, run: dict) -> str:
        return f"{run['rate'] / 1e6:.2f}M tokens/s"

    runs = interleaved(list(CONFIGS), args.reps, measure, said, "core_sharing")

    def turns_run(_) -> dict | None:
        return in_fresh_process(
            __file__, ["--child", "turns"], "turns", timeout=600, env=dict(os.environ, **ONE_THREAD)
        )

    def turns_said(_, run: dict) -> str:
        beside = (f"{float(k) * 1e3:g} ms: {run[k][0]:.3f} s" for k in map(str, TURNS_INTERVALS))
        return f"encoding alone {run['alone'][0]:.3f} s, beside Python " + ", ".join(beside)

    turn_runs = interleaved(["GIL turns"], args.reps, turns_run, turns_said, "core_sharing")["GIL turns"]

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
    lines += [
        "",
        "What bounds each runner: over the second half of each run's tokens, its tokens/s, the CPU "
        "(user and system) a million tokens of the run's process and of its workers, and the cores "
        "they kept busy (CPU over wall time); medians:",
        "",
        "| configuration | tokens/s, second half | CPU ms / M tokens, run's process | its workers "
        "| cores busy |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in CONFIGS:
        halves = [run for run in runs[name] if "half_rate" in run]
        if not halves:  # the process workers came up after every run's end
            lines.append(f"| {name} | - | - | - | - |")
            continue
        keys = ("half_rate", "half_own_ms", "half_workers_ms")
        rate, own, workers = (statistics.median(run[k] for run in halves) for k in keys)
        busy = statistics.median(
            run["half_rate"] * (run["half_own_ms"] + run["half_workers_ms"]) / 1e9 for run in halves
        )
        shown = f"{workers:.1f}" if CONFIGS[name][0] == "process" else "-"
        lines.append(f"| {name} | {rate / 1e6:.2f}M | {own:.1f} | {shown} | {busy:.2f} |")
    lines += ["", "Every run, tokens/s end to end (M), in the order run:"]
    for name in CONFIGS:
        lines.append(f"- {name}: " + ", ".join(f"{run['rate'] / 1e6:.2f}" for run in runs[name]))
    lines += _turns_lines(turn_runs)
    write_result("core_sharing.txt", lines)


def _turns_lines(runs: list[dict]) -> list[str]:
    def med(key: str, i: int) -> float:
        return statistics.median(run[key][i] for run in runs)

    alone = med("alone", 0)
    lines = [
        "",
        "## Turns on the GIL",
        "",
        f"The corpus's text ({runs[0]['chars'] / 1e6:.1f}M characters, three times over, in "
        f"{runs[0]['calls']} calls of about {CALL_CHARS >> 10} KiB) encoded by fastokens on one "
        f"thread, alone and beside a thread that only runs Python; each run in a fresh process, "
        f'medians of {len(runs)}. "Python\'s pace": how far that thread got, against itself alone.',
        "",
        "| encoding | wall | vs alone | its CPU | Python's pace |",
        "|---|---:|---:|---:|---:|",
        f"| alone | {alone:.3f} s | 1.00x | {med('alone', 1):.3f} s | - |",
    ]
    for interval in map(str, TURNS_INTERVALS):
        wall = med(interval, 0)
        lines.append(
            f"| beside Python, switch interval {float(interval) * 1e3:g} ms | {wall:.3f} s | "
            f"{wall / alone:.2f}x | {med(interval, 1):.3f} s | {med(interval, 2):.2f}x |"
        )
    return lines


if __name__ == "__main__":
    main()
