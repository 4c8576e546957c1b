#!/usr/bin/env python
"""One rank process at more cores: tokens/s by runner and worker count, against the projection.

``benchmarks/results/profile.md`` projects one rank process at 16 and 64 cores from a 2-core
profile: with the process runner ``tokens/s(C) = 1e6 / max(W' / C, P)``, P the rank process's own
core-seconds per million tokens (mixer, packing, batches, receiving results), W' every process's.
This measures it on the machine it runs on: the throughput benchmark's pipeline
(``benchmarks/peers/zephon_self.py``: three real-text datasets mixed, GPT-2 BPE, 8 lanes,
``pack_flat(2048)``; the ``--child`` run of ``benchmarks/time_profile.py``, not sampled) inline, with
1, 2, 4, 8 and as many thread workers as cores, and with 1, 2, 4, 8 and cores - 1 process workers
(the rank process keeps a core), each in a fresh process, the configurations interleaved
``--reps`` times. Each run reports tokens/s end to end and from a tenth of its tokens on, and P
and W' over that steady part. Writes ``benchmarks/results/core_scaling_<cores>.md`` and a plot
beside it (or under ``--results``).

    python benchmarks/core_scaling.py [--tokens 40000000] [--reps 1] [--copies 16] [--results DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PROFILE = os.path.join(RESULTS, "profile.md")  # the text written once; profile_corpus.md: 16 times
_FIGURES = r"P = ([0-9.]+) core-s per million tokens, and that of every process,\s+W' = ([0-9.]+)"


def profile_figures(path: str = PROFILE) -> tuple[float, float] | None:
    """P and W' as ``benchmarks/time_profile.py`` last wrote them into a profile (its process run,
    2 workers): what its projection was made from; None where the file does not say."""
    try:
        with open(path) as f:
            found = re.search(_FIGURES, f.read())
    except OSError:
        return None
    return (float(found[1]), float(found[2])) if found else None


def configurations(cores: int) -> list[tuple[str, int]]:
    """(runner, workers) to measure on ``cores`` cores: counts past the cores left out."""
    threads = sorted({w for w in (1, 2, 4, 8) if w <= cores} | {cores})
    processes = sorted({w for w in (1, 2, 4, 8) if w < cores} | {max(cores - 1, 1)})
    return [("inline", 1)] + [("thread", w) for w in threads] + [("process", w) for w in processes]


def projected(workers: int, cores: int, p: float, w: float) -> float:
    """tokens/s of the process runner with ``workers`` workers: the rank process plus its workers
    on at most ``cores`` cores, from P and W' (core-seconds per million tokens)."""
    used = min(workers + 1, cores)
    return 1e6 / max(w / used, p)


def plot(rows: list[dict], cores: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for runner, marker in (("thread", "o"), ("process", "s")):
        mine = [r for r in rows if r["runner"] == runner]
        ax.plot([r["workers"] for r in mine], [r["steady"] / 1e6 for r in mine], marker=marker, label=runner)
    inline = next(r for r in rows if r["runner"] == "inline")
    ax.axhline(inline["steady"] / 1e6, color="grey", linestyle="--", label="inline")
    ax.set_xlabel("workers")
    ax.set_ylabel("M tokens/s (after the first tenth)")
    ax.set_title(f"One rank process on {cores} cores (fastokens, 8 lanes)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=40_000_000)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--copies", type=int, default=16)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--results", help="folder for the results (default benchmarks/results)")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)  # benchmarks.common, from a source checkout
    from benchmarks.common import compile_project, in_fresh_process, interleaved, refuse_fewer_than_one_copy

    refuse_fewer_than_one_copy(parser, args.copies)
    if args.tokens < 10 or args.reps < 1:
        parser.error(f"--tokens {args.tokens} --reps {args.reps}: give at least 10 tokens and 1 rep")
    cores = len(os.sched_getaffinity(0))
    configs = configurations(cores)
    compile_project()
    script = os.path.join(ROOT, "benchmarks", "time_profile.py")

    def measure(config: tuple[str, int]) -> dict | None:
        runner, workers = config
        argv = ["--child", "--runner", runner, "--workers", str(workers), "--backend", args.backend]
        argv += ["--tokens", str(args.tokens), "--copies", str(args.copies)]
        return in_fresh_process(script, argv, f"{runner} x{workers}", timeout=1200)

    def say(config: tuple[str, int], run: dict) -> str:
        return f"{run['steady_rate'] / 1e6:.2f}M tokens/s steady, P {run['own_cpu_per_m']:.4f}"

    runs = interleaved(configs, args.reps, measure, say, "core_scaling", name=lambda c: f"{c[0]} x{c[1]}")

    rows = []
    for (runner, workers), mine in runs.items():
        med = {key: statistics.median(r[key] for r in mine) for key in mine[0]}
        rows.append({"runner": runner, "workers": workers, "steady": med["steady_rate"],
                     "end": med["tokens"] / med["seconds"], "p": med["own_cpu_per_m"],
                     "w": med["all_cpu_per_m"]})  # fmt: skip
    inline = next(r for r in rows if r["runner"] == "inline")["steady"]
    processes = [r for r in rows if r["runner"] == "process"]
    # the projection's P and W' from the fewest process workers, checked against the rest
    ref = min(processes, key=lambda r: abs(r["workers"] - 2))
    # the profile of the same data: profile_corpus.md is the text written 16 times over
    profile_name = "profile_corpus.md" if args.copies > 1 else "profile.md"
    figures = profile_figures(os.path.join(RESULTS, profile_name))
    lines = [
        f"# One rank process on {cores} cores",
        "",
        f"`python benchmarks/core_scaling.py --tokens {args.tokens} --reps {args.reps} "
        f"--copies {args.copies}` on {platform.machine()}, {cores} cores ({os.cpu_count()} CPUs), Python "
        f"{platform.python_version()}: the throughput benchmark's pipeline (backend {args.backend}, "
        "8 lanes) on its real text written over as a corpus, each run in a fresh process, "
        f"configurations interleaved; medians of {args.reps}. Steady: from a tenth of the tokens on. "
        "P: the rank process's own core-seconds per million tokens (all its threads); W': every "
        "process's. Inline and with threads all of it runs in the rank process (P = W', over "
        "several threads); with process workers 1e6 / P bounds what the rank process delivers.",
        "",
        "| runner | workers | tokens/s steady | vs inline | end to end | P | W' | 1e6 / P "
        f"| projected from process x{ref['workers']} | from {profile_name} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        bound = here = profile = "-"  # P bounds the process runner's rank process only
        if r["runner"] == "process":
            bound = f"{1e6 / r['p'] / 1e6:.1f}M"
            here = f"{projected(r['workers'], cores, ref['p'], ref['w']) / 1e6:.1f}M"
            if figures:
                profile = f"{projected(r['workers'], cores, *figures) / 1e6:.1f}M"
        lines.append(
            f"| {r['runner']} | {r['workers']} | {r['steady'] / 1e6:.2f}M | {r['steady'] / inline:.2f}x | "
            f"{r['end'] / 1e6:.2f}M | {r['p']:.4f} | {r['w']:.4f} | {bound} | {here} | {profile} |"
        )
    best = max(processes, key=lambda r: r["steady"])
    of_profile = f"P = {figures[0]}, W' = {figures[1]}" if figures else "none found"
    lines += [
        "",
        f"Projection (`benchmarks/results/{profile_name}`): `tokens/s = 1e6 / max(W' / min(workers + 1, "
        f"cores), P)`, from this run's process x{ref['workers']} (P = {ref['p']:.4f}, W' = {ref['w']:.4f}) "
        f"and from the profile's own process run ({of_profile}). The best process run "
        f"(x{best['workers']}) delivered {best['steady'] / 1e6:.2f}M tokens/s, its rank process "
        f"busy on {best['steady'] * best['p'] / 1e6:.2f} cores (P x tokens/s; over 1: its threads "
        "overlap, and 1e6 / P is no hard bound).",
    ]
    lines += ["", "Every run, tokens/s steady (M), in the order run:"]
    for (runner, workers), mine in runs.items():
        lines.append(f"- {runner} x{workers}: " + ", ".join(f"{r['steady_rate'] / 1e6:.2f}" for r in mine))
    folder = args.results or RESULTS
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"core_scaling_{cores}")
    with open(path + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rows, cores, path + ".png")


if __name__ == "__main__":
    main()
