#!/usr/bin/env python
"""Where this project's time goes: py-spy samples of the throughput benchmark's pipeline.

Runs ``benchmarks/peers/zephon_self.py`` (the three-dataset token mixture, GPT-2 BPE, 8 lanes,
pack_flat(2048), shuffle 256, microbatch 8) under ``py-spy record`` for ``--tokens`` tokens, with
the given runner, workers and tokenizer backend, twice: once sampling every thread that is on a
core (where the core-seconds go), once only the thread holding the GIL (what cannot run on more
cores than one at a time). Writes, to benchmarks/results/profile.md, the core-seconds per
million tokens by kind of work, a projection of one rank process at more cores, and the
functions that hold the GIL most. The tokenizer's own threads are pinned to one per worker
(``FASTOKENS_BPE_THREADS=1``), so that its time is sampled in the thread that called it.

    python benchmarks/time_profile.py [--runner thread --workers 2 --backend auto --tokens 100000000]
                                      [--copies 16 --out profile_corpus]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# kind of work -> function names (py-spy's, without the file) that mark it, first match wins,
# searched from the innermost frame out; a name also marks what is defined inside it (a class's
# methods, a function's comprehensions): "Batch" marks "Batch.tokens_per_dataset.<locals>..."
KINDS = {
    # the sampled process writes the benchmark's data first: its own cost, not the loader's (it
    # had fallen under "consumer", through run(), about 1 s a run)
    "the benchmark's data written (not the loader)": ("text_setup",),
    "start-up (imports, tokenizer load and probes, planning)": (
        "_find_and_load", "FastBackend._load", "HFTokenizer.__init__", "first_difference", "lane_plan",
        "Pipeline.tokenize", "_load_unlocked",
    ),
    "tokenizer (encode_batch_flat)": ("_flat", "HFTokenizer.encode_batch", "encode_flat"),
    "JSON lines (msgspec, one call a chunk)": ("_whole_chunk", "_line_by_line", "parse_lines"),
    "read (file, content digest)": ("Read.work",),
    "tokenize step (fields, BOS/EOS, positions)": ("Tokenize.work",),
    "mixer (which document next)": ("Mixer.take", "Mixer._settle", "Mixer.__init__"),
    "pack (rows laid out, shuffled order)": ("build_rows", "by_row", "wrap", "best_fit", "PackFlat.fill"),
    "batch and delivery (counts, state)": (
        "BatchRows.split", "_Delivery", "LaneDriver", "Made", "lane_batches", "Batch", "_Driven",
    ),
    "runner (queues, futures)": (
        "UrgentQueue", "WorkerThreads", "ProcessExecutor", "ChunkStreams", "Future",
    ),
    "consumer (the benchmark's loop)": ("run", "batches"),
}  # fmt: skip


RUNNER_NOTE = [
    "The runner row holds worker threads that py-spy sampled while they waited for work (it",
    "cannot always tell a waiting thread), so W is an upper bound, and the projection below a",
    "lower one.",
    "",
]


def run(args: argparse.Namespace) -> None:
    """The profiled process: the benchmark's pipeline until enough tokens. CPU and rate are
    counted from a tenth of the tokens on and, with the process runner, once its workers run
    (before, the rank process encodes the first chunks itself: that is start-up, not the work
    it keeps), or from half of the tokens where they never showed."""
    from benchmarks.common import text_setup
    from benchmarks.peers import zephon_self

    others = Descendants()
    with tempfile.TemporaryDirectory() as tmp:
        setup = text_setup(tmp, args.copies, method=args.runner, workers=args.workers,
                           options={"backend": args.backend})  # fmt: skip
        done, start, steady, looked = 0, time.perf_counter(), None, 0.0
        for out in zephon_self.batches(setup):
            done += int(out.valid.sum())
            late = done >= args.tokens // 2  # never later than this, nor than the last batch
            if steady is None and done >= args.tokens // 10 and (late or time.perf_counter() - looked > 0.05):
                looked = time.perf_counter()
                up = args.runner != "process" or others.running() > args.workers  # the fork server too
                if up or late:
                    steady = done, time.process_time(), others.cpu(), time.perf_counter()
            if done >= args.tokens:
                break
        if steady is None or done == steady[0]:
            others.stop.set()
            sys.exit(f"--tokens {args.tokens}: no batches after the first tenth to measure; give more "
                     f"(a batch here holds {int(out.valid.size):,} tokens)")  # fmt: skip
        tokens, wall = done - steady[0], time.perf_counter() - steady[3]
        own, workers = time.process_time() - steady[1], others.since(steady[2])
        others.stop.set()
        result = {"tokens": done, "seconds": time.perf_counter() - start, "own_cpu_per_m": own / tokens * 1e6,
                  "all_cpu_per_m": (own + workers) / tokens * 1e6, "steady_rate": tokens / wall,
                  "steady_from": steady[0]}  # fmt: skip
        print(json.dumps(result), flush=True)


class Descendants:
    """CPU seconds of this process's descendants (the fork server, its worker processes), each
    as last read: a thread reads them every ``every`` seconds, so that one that ends keeps its
    last reading (summing the live ones alone, a process gone between two readings had taken
    its seconds with it, and the workers' CPU once came out negative)."""

    def __init__(self, every: float = 0.2):
        self.seen: dict[tuple[int, float], float] = {}  # (pid, created) -> CPU seconds
        self.live = 0
        self.lock, self.stop = threading.Lock(), threading.Event()
        threading.Thread(target=self._watch, args=(every,), daemon=True).start()

    def _watch(self, every: float) -> None:
        while not self.stop.wait(every):
            self.read()

    def read(self) -> None:
        import psutil

        live = 0
        for child in psutil.Process().children(recursive=True):
            try:
                times, key = child.cpu_times(), (child.pid, child.create_time())
                tracker = "resource_tracker" in " ".join(child.cmdline())
            except psutil.Error:  # ended meanwhile: its last reading stands
                continue
            live += not tracker
            with self.lock:
                self.seen[key] = times.user + times.system
        self.live = live

    def running(self) -> int:
        """Descendants alive now, multiprocessing's resource tracker left out."""
        self.read()
        return self.live

    def cpu(self) -> dict[tuple[int, float], float]:
        self.read()
        with self.lock:
            return dict(self.seen)

    def since(self, before: dict[tuple[int, float], float]) -> float:
        """CPU seconds the descendants used since the reading ``before`` (new ones: all of theirs)."""
        now = self.cpu()
        return sum(cpu - before.get(key, 0.0) for key, cpu in now.items())


def read_raw(raw: str) -> list[tuple[list[str], int]]:
    out = []
    with open(raw) as f:
        for line in f:
            stack, count = line.rsplit(" ", 1)
            out.append(([frame.split(" (")[0] for frame in stack.split(";")], int(count)))
    return out


# each kind's names as prefixes of what is defined inside them ("Batch." for "Batch.tokens_per_dataset")
_INSIDE = {kind: tuple(name + "." for name in names) for kind, names in KINDS.items()}


def kind_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for kind, names in KINDS.items():
            if frame in names or frame.startswith(_INSIDE[kind]):
                return kind
    return "other"


def by_kind(samples, rate: int, tokens: int) -> dict[str, float]:
    """Core-seconds per million tokens, by kind of work."""
    counts = Counter()
    for frames, n in samples:
        counts[kind_of(frames)] += n
    return {k: counts[k] / rate / tokens * 1e6 for k in [*KINDS, "other"] if counts[k]}


def top_functions(samples, top: int = 20) -> list[str]:
    inclusive, own, total = Counter(), Counter(), 0
    for frames, n in samples:
        total += n
        own[frames[-1]] += n
        for name in set(frames):
            inclusive[name] += n
    lines = [f"{total} samples with the GIL held", "", "| inclusive | own | function |", "|---:|---:|---|"]
    for name, count in inclusive.most_common(top):
        lines.append(f"| {count / total:.1%} | {own[name] / total:.1%} | `{name}` |")
    return lines


def record(args, gil: bool, tmp: str) -> tuple[list, dict]:
    raw = os.path.join(tmp, f"profile{int(gil)}.txt")
    options = ["--runner", args.runner, "--workers", str(args.workers), "--backend", args.backend]
    options += ["--copies", str(args.copies)]
    child = [sys.executable, os.path.abspath(__file__), "--child", *options, "--tokens", str(args.tokens)]
    flags = ["--gil"] if gil else []
    env = {**os.environ, "FASTOKENS_BPE_THREADS": "1"}
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")  # the environment's, else PATH's
    spy = [
        here if os.path.exists(here) else "py-spy",
        "record",
        *flags,
        "-r",
        str(args.rate),
        "-f",
        "raw",
        "-o",
        raw,
        "--",
        *child,
    ]
    done = subprocess.run(spy, check=True, env=env, capture_output=True, text=True)
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    return read_raw(raw), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runner", default="thread")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--tokens", type=int, default=100_000_000)
    parser.add_argument("--rate", type=int, default=200, help="samples per second")
    parser.add_argument(
        "--copies", type=int, default=1, help="each dataset written this many times over (a corpus's chunks)"
    )
    parser.add_argument("--out", default="profile", help="results file name")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)  # benchmarks.common and benchmarks.peers, from a source checkout
    from benchmarks.common import refuse_fewer_than_one_copy

    refuse_fewer_than_one_copy(parser, args.copies)
    if args.child:
        run(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        cpu, cpu_run = record(args, False, tmp)
        gil, gil_run = record(args, True, tmp)
    options = ["--runner", "process", "--workers", str(args.workers), "--backend", args.backend]
    options += ["--copies", str(args.copies)]
    child = [sys.executable, os.path.abspath(__file__), "--child", *options, "--tokens", str(args.tokens)]
    done = subprocess.run(child, check=True, capture_output=True, text=True)  # not sampled
    process_run = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    lines = report(args, cpu, cpu_run, gil, gil_run, process_run)
    from benchmarks.common import write_result

    write_result(f"{args.out}.md", lines)


def _outside(kind: str) -> bool:
    """Whether a kind of work is left out of the steady total: start-up, the benchmark's own."""
    return kind.startswith(("start-up", "the benchmark's data"))


def report(args, cpu, cpu_run, gil, gil_run, process_run) -> list[str]:
    cores = by_kind(cpu, args.rate, cpu_run["tokens"])
    held = by_kind(gil, args.rate, gil_run["tokens"])
    steady = {k: v for k, v in cores.items() if not _outside(k)}
    w, g = sum(steady.values()), sum(v for k, v in held.items() if not _outside(k))
    c = os.cpu_count() or 1
    lines = [
        "# Where the time goes",
        "",
        f"`python benchmarks/time_profile.py --runner {args.runner} --workers {args.workers} --backend "
        f"{args.backend} --tokens {args.tokens}"
        + (f" --copies {args.copies} --out {args.out}" if args.copies > 1 else "")
        + f"` on {platform.machine()}, {c} CPUs. py-spy at {args.rate} "
        "samples/s, twice: every thread on a core (core-seconds), and only the thread holding the GIL. "
        "The tokenizer's own threads pinned to one per worker, so its time is sampled where it is "
        f"called. Runs: {cpu_run['tokens'] / cpu_run['seconds'] / 1e6:.2f}M and "
        f"{gil_run['tokens'] / gil_run['seconds'] / 1e6:.2f}M tokens/s under the sampler.",
        "",
        *(
            [
                f"Data: each dataset's text written {args.copies} times over (a corpus's size: zephon "
                "reads it in chunks of 1 MiB, where the text written once gives chunks of about 70 KiB).",
                "",
            ]
            if args.copies > 1
            else []
        ),
        "## Core-seconds per million tokens, by kind of work",
        "",
        "| work | core-s / M tokens | share (steady) | GIL-held s / M tokens |",
        "|---|---:|---:|---:|",
    ]
    for kind, value in cores.items():
        share = "-" if _outside(kind) else f"{value / w:.1%}"
        lines.append(f"| {kind} | {value:.4f} | {share} | {held.get(kind, 0.0):.4f} |")
    lines += [
        f"| **steady total** (start-up and the data's writing left out) | **{w:.4f}** | 100% | **{g:.4f}** |",
        "",
        *(RUNNER_NOTE if cores.get("runner (queues, futures)") else []),
        "## One rank process at more cores",
        "",
        "With the thread runner, work that holds the GIL runs one thread at a time, whatever the cores;",
        "the rest (the tokenizer's encoding, file reads, hashing, numpy's copies) spreads over them.",
        "So one rank process delivers at most",
        "",
        "    tokens/s(C) = 1e6 / max(W / C, G)",
        "",
        f"where W = {w:.4f} core-s and G = {g:.4f} GIL-held s per million tokens (the steady totals "
        "above), C the cores it has (workers = C):",
        "",
        "| cores | W / C bound | G bound | projected tokens/s | bound by |",
        "|---:|---:|---:|---:|---|",
    ]
    for cores_n in (2, 16, 64):
        cpu_bound, gil_bound = 1e6 / (w / cores_n), 1e6 / g if g else float("inf")
        rate = min(cpu_bound, gil_bound)
        bound = "cores" if cpu_bound < gil_bound else "the GIL (one rank process)"
        lines.append(
            f"| {cores_n} | {cpu_bound / 1e6:.1f}M | {gil_bound / 1e6:.1f}M | {rate / 1e6:.1f}M | {bound} |"
        )
    p, wp = process_run["own_cpu_per_m"], process_run["all_cpu_per_m"]
    lines += [
        "",
        "Past the GIL bound more cores need more processes: the process runner moves reading, JSON",
        "and tokenizing into worker processes, leaving the rank process the lane's own work",
        "(mixer, pack, batch and delivery rows above) and receiving results. Measured with",
        f"{args.workers} process workers over the same run, not sampled, from a tenth of the tokens on",
        f"({process_run['steady_rate'] / 1e6:.1f}M tokens/s): the rank process's own CPU, all its threads,",
        f"P = {p:.4f} core-s per million tokens, and that of every process, W' = {wp:.4f}",
        "(py-spy's W above counts more: sampled threads it cannot tell are waiting, and its own",
        "cost). P is one process's; the rest spreads over the workers, so one rank process",
        "delivers at most",
        "",
        "    tokens/s(C) = 1e6 / max(W' / C, P)",
        "",
        "| cores | W' / C bound | P bound | projected tokens/s | bound by |",
        "|---:|---:|---:|---:|---|",
    ]
    for cores_n in (2, 16, 64):
        cpu_bound, own_bound = 1e6 / (wp / cores_n), 1e6 / p
        bound = "cores" if cpu_bound < own_bound else "the rank process's own work"
        lines.append(
            f"| {cores_n} | {cpu_bound / 1e6:.1f}M | {own_bound / 1e6:.1f}M | "
            f"{min(cpu_bound, own_bound) / 1e6:.1f}M | {bound} |"
        )
    lines += [
        "",
        "8 ranks on a 64-core node are 8 such processes, each with 7 workers. The formula against",
        "measured runs on the cores at hand, up to a worker per core: `python benchmarks/core_scaling.py`",
        "(`core_scaling_<cores>.md`: on 2 cores here, `core_scaling_2.md`; on a GPU machine's 16 cores",
        "through `scripts/device_check.sh`, `core_scaling_16.md`).",
        "",
        "## Functions holding the GIL",
        "",
        *top_functions(gil),
    ]
    return lines


if __name__ == "__main__":
    main()
