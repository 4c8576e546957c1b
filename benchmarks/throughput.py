#!/usr/bin/env python
"""Throughput of this project, its peers and the tokenizer alone, side by side in one run.

Real text (KJV verses, KJV chapters, whole Python standard-library files; three JSON lines
datasets mixed .40 / .35 / .25), GPT-2 BPE, rows of 2049 tokens, shuffle 256, microbatch 8, 8
lanes where a system has lanes. Every measurement runs in a fresh process, systems interleaved,
``--reps`` times; the table shows medians:

- packed tokens/s, end to end from building the loader to the ``--tokens``-th token (start-up
  included: a loader that front-loads its work cannot look faster than it is), and the time to
  the first batch;
- stall share: a loop that "trains" each batch for a fixed time, at a quarter of the
  tokenizer-alone rate (which every system sustains on average), for ``--stall-tokens``; the
  share of the loop's time after the first batch spent waiting for batches, and the longest wait;
- peak RSS of the loader's whole process tree (sampled every 50 ms), padding share (label
  positions that are padding), checkpoint bytes per lane where a system has a checkpoint.

Peers: ``zephon==0.2.0`` (installed on first use into benchmarks/.peers/, it has this project's
import name), Grain 0.2.18 in its fastest and in its worker-invariant layout, torchdata 0.11 nodes,
TorchTitan 0.3.0's own loader (``pip install -e '.[bench]'``). Writes
benchmarks/results/throughput.md and .png.

    python benchmarks/throughput.py [--tokens 8000000] [--reps 3] [--only zephon ...] [--out NAME]

``--copies K`` writes each dataset K times over: the same documents, repeated, in a file the
size of a corpus, which a loader reads as it reads a corpus (zephon's chunks follow a dataset's
size: about 70 KiB for the 4-5 MiB of real text, 1 MiB from 64 MiB on). A long run over the
text written once reads it dozens of times, in small chunks no corpus of that run's size has.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # benchmarks.common and benchmarks.peers, from a source checkout

from benchmarks.common import (  # noqa: E402
    GPU_TOKENS_PER_S,
    MIXTURE,
    PeakRSS,
    compile_project,
    in_fresh_process,
    interleaved,
    refuse_fewer_than_one_copy,
    result_path,
    write_copies,
    write_json,
    write_result,
)

CORES = os.cpu_count() or 1

# label -> (module in benchmarks.peers, function, Setup fields)
SYSTEMS: dict[str, tuple[str, str, dict]] = {
    "tokenizers alone (HF encode_batch)": ("tokenizer_alone", "hf", {}),
    "fastokens alone (encode_batch_flat)": ("tokenizer_alone", "fast", {}),
}
for _backend, _name in (("tokenizers", "HF tokenizers"), ("auto", "fastokens")):
    _options = {"options": {"backend": _backend}}
    SYSTEMS[f"zephon inline, {_name}"] = (
        "zephon_self",
        "batches",
        {"method": "inline", "workers": 1, **_options},
    )
    for _method in ("thread", "process"):
        for _workers in range(1, CORES + 1):
            _fields = {"method": _method, "workers": _workers, **_options}
            SYSTEMS[f"zephon {_method} x{_workers}, {_name}"] = ("zephon_self", "batches", _fields)
SYSTEMS.update({
    "zephon 0.2.0 thread": ("zephon020", "batches", {"method": "thread", "workers": CORES}),
    "zephon 0.2.0 process": ("zephon020", "batches", {"method": "process", "workers": CORES}),
    "Grain 0.2.18 fastest": ("grain_loader", "batches_fastest", {"workers": CORES}),
    "Grain 0.2.18 worker-invariant": ("grain_loader", "batches_invariant", {"workers": CORES}),
    "torchdata 0.11 nodes, threads": ("torchdata_nodes", "batches", {"method": "thread", "workers": CORES}),
    "torchdata 0.11 nodes, processes": (
        "torchdata_nodes", "batches", {"method": "process", "workers": CORES}
    ),
    "TorchTitan 0.3.0 loader": ("torchtitan_loader", "batches", {"workers": CORES}),
})  # fmt: skip


# -- one measurement, in its own process ------------------------------------------------------


def measure(spec: dict) -> dict:
    module, function, fields = SYSTEMS[spec["system"]]
    if module == "zephon020":
        from benchmarks.peers import zephon020

        sys.path.insert(0, zephon020.ensure_installed())
    from benchmarks.peers.common import Setup

    setup = Setup(**{**spec["setup"], **fields})
    if module == "tokenizer_alone":
        from benchmarks.peers import tokenizer_alone

        return tokenizer_alone.rate(setup, function, spec["tokens"])
    peer = importlib.import_module(f"benchmarks.peers.{module}")
    if spec.get("state"):
        return {"state_bytes": _state_bytes(peer, module, function, setup)}
    rss = PeakRSS()
    consumer_seconds = spec.get("seconds_per_token", 0.0)
    start = time.perf_counter()
    batches = getattr(peer, function)(setup)
    first = None
    valid = labels = positions = empty = 0
    waits, waited_since = [], time.perf_counter()
    for out in batches:
        now = time.perf_counter()
        if first is None:
            first, loop_start = now - start, now
        else:
            waits.append(now - waited_since)
        n = int(out.valid.sum())
        valid, positions = valid + n, positions + int(out.valid[:, 1:].size)
        labels += int(out.valid[:, 1:].sum())
        empty += int((out.valid.sum(axis=1) == 0).sum())
        if consumer_seconds:
            time.sleep(n * consumer_seconds)  # "training" on this batch
        waited_since = time.perf_counter()
        if valid >= spec["tokens"]:
            break
    elapsed = time.perf_counter() - start
    batches.close()
    rss.stop.set()
    result = {
        "tokens_per_s": valid / elapsed,
        "first_batch_s": first,
        "padding": 1 - labels / positions if positions else None,
        "empty_rows": empty,
        "peak_rss": rss.peak,
        "peak_pss": rss.peak_pss or None,
    }
    if consumer_seconds:
        loop = time.perf_counter() - loop_start
        result.update(stall_share=sum(waits) / loop, longest_wait=max(waits, default=0.0))
    return result


def _state_bytes(peer, module: str, function: str, setup) -> int | None:
    """A checkpoint's bytes after 40 batches, where the system has a checkpoint."""
    if not hasattr(peer, "state_bytes"):
        return None
    if module == "grain_loader":  # Grain's state is its iterator's
        dataset = peer.fastest_dataset if function == "batches_fastest" else peer.invariant_dataset
        iterator = iter(dataset(setup))
        for _ in range(40):
            next(iterator)
        return peer.state_bytes(iterator)
    return peer.state_bytes(setup)


# -- the run ------------------------------------------------------------------------------------


def run_one(spec: dict, timeout: float) -> dict | None:
    return in_fresh_process(__file__, ["--one", json.dumps(spec)], spec["system"], timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8_000_000)
    parser.add_argument("--stall-tokens", type=int, default=8_000_000)
    parser.add_argument(
        "--alone-tokens",
        type=int,
        help="tokens for the tokenizers alone (default --tokens): their rate is steady",
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--copies",
        type=int,
        default=1,
        help="write each dataset this many times over: a corpus of that size, chunked as such",
    )
    parser.add_argument("--stall-reps", type=int, default=2, help="runs of the stall loop per system")
    parser.add_argument("--out", default="throughput", help="results file name (with --only: a subset)")
    parser.add_argument("--only", nargs="*", help="systems whose label contains one of these")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument(
        "--render", action="store_true", help="rewrite the table from results/throughput.json"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    refuse_fewer_than_one_copy(parser, args.copies)
    if args.render:
        with open(result_path(f"{args.out}.json")) as f:
            saved = json.load(f)
        args.tokens, args.reps, args.stall_tokens = saved["tokens"], saved["reps"], saved["stall_tokens"]
        args.stall_reps, args.copies = saved.get("stall_reps", 1), saved.get("copies", 1)
        args.sizes = saved.get("sizes", {})
        _write(saved["runs"], saved["stalls"], saved["extras"], saved["limit"], args)
        return
    if args.one:
        print(json.dumps(measure(json.loads(args.one))), flush=True)
        return
    systems = [s for s in SYSTEMS if not args.only or any(o in s for o in args.only)]
    compile_project()
    from zephon.testing import gpt2_tokenizer_dir
    from zephon.testing.data import real_text_corpora

    with tempfile.TemporaryDirectory() as tmp:
        files = {name: path for name, (path, _) in real_text_corpora(tmp).items()}
        args.sizes = write_copies(files, args.copies)
        setup = {
            "files": files,
            "weights": MIXTURE,
            "tokenizer": gpt2_tokenizer_dir(os.path.join(tmp, "gpt2")),
            "copies": args.copies,
        }

        def one_run(system: str) -> dict | None:
            alone = SYSTEMS[system][0] == "tokenizer_alone" and args.alone_tokens
            tokens = args.alone_tokens if alone else args.tokens
            return run_one({"system": system, "setup": setup, "tokens": tokens}, args.timeout)

        runs = interleaved(systems, args.reps, one_run)
        limit = statistics.median(
            r["tokens_per_s"] for r in runs.get(next(iter(SYSTEMS)), []) or [{"tokens_per_s": 1e6}]
        )
        per_token = 1 / (0.25 * limit)

        def stall(system: str) -> dict | None:
            spec = {
                "system": system,
                "setup": setup,
                "tokens": args.stall_tokens,
                "seconds_per_token": per_token,
            }
            return run_one(spec, args.timeout)

        loaders = [system for system in systems if SYSTEMS[system][0] != "tokenizer_alone"]
        print("the stall loop:", flush=True)
        stalls = {
            system: runs for system, runs in interleaved(loaders, args.stall_reps, stall).items() if runs
        }
        extras = {}
        for system in systems:
            if SYSTEMS[system][0] != "tokenizer_alone" and "process" not in system and "x1" not in system:
                result = run_one({"system": system, "setup": setup, "tokens": 0, "state": True}, args.timeout)
                extras[system] = (result or {}).get("state_bytes")
    _write(runs, stalls, extras, limit, args)


def _write(runs, stalls, extras, limit, args) -> None:
    import importlib.metadata as md

    for results in runs.values():  # the rate once the first batch is out: without start-up
        for r in results:
            if r.get("first_batch_s") is not None:
                r["after_first"] = args.tokens / (args.tokens / r["tokens_per_s"] - r["first_batch_s"])

    def median(system, key):
        values = [r[key] for r in runs.get(system, []) if r.get(key) is not None]
        return statistics.median(values) if values else None

    rows = []
    for system in runs:
        rate = median(system, "tokens_per_s")
        if rate is None:
            continue
        stall = _median_of(stalls.get(system))
        first, rss, padding = (median(system, k) for k in ("first_batch_s", "peak_rss", "padding"))
        after, pss = median(system, "after_first"), median(system, "peak_pss")
        stalled = stall.get("stall_share"), stall.get("longest_wait")
        rows.append((system, rate, first, *stalled, rss, padding, after, pss))

    def version(package: str) -> str:  # a peer left out with --only need not be installed
        try:
            return md.version(package)
        except md.PackageNotFoundError:
            return "not installed"

    packages = ("tokenizers", "fastokens", "grain", "torchdata", "torchtitan", "torch")
    versions = {p: version(p) for p in packages}
    lines = [
        "# Throughput: this project, its peers and the tokenizer alone",
        "",
        f"Machine: {platform.machine()}, {CORES} CPUs, Python {platform.python_version()}; "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + ", zephon 0.2.0 (PyPI).",
        f"Command: `python benchmarks/throughput.py --tokens {args.tokens} --reps {args.reps} "
        f"--stall-reps {args.stall_reps}"
        + (f" --alone-tokens {args.alone_tokens}" if getattr(args, "alone_tokens", None) else "")
        + (f" --copies {args.copies}" if args.copies > 1 else "")
        + (f" --out {args.out} --only " + " ".join(repr(o) for o in args.only) if args.only else "")
        + "`. "
        f"Medians of {args.reps} interleaved runs, each in a fresh process, {args.tokens:,} tokens "
        "end to end.",
        *(
            [
                f"Data: each dataset's real text written {args.copies} times over, a corpus of "
                + ", ".join(f"{n} {b / 2**20:.0f} MiB" for n, b in args.sizes.items())
                + ", which every system reads as such: zephon cuts each into chunks of about 1 MiB (a "
                "dataset's size over 8 chunks for each of 8 lanes, at most 1 MiB; the text written once, "
                "4-5 MiB, into chunks of about 70 KiB)."
            ]
            if args.copies > 1
            else []
        ),
        "Packed tokens/s counts from building the loader (its start-up, imports included, from "
        'bytecode compiled as at install) to the last token; "after the first batch" leaves the '
        "start-up out. Peak RSS: the sum of the resident sets of the loader's processes (a page "
        "they share counts in each); in brackets, where measured, the sum of their proportional "
        "sets (PSS: a page shared by n processes counts 1/n in each), the memory they take together.",
        f"Stall: a loop that trains each batch at a quarter of the HF tokenizer's rate "
        f"({0.25 * limit / 1e6:.2f}M tokens/s), {args.stall_tokens:,} tokens; medians of "
        f"{args.stall_reps} runs (`--stall-reps`), interleaved.",
        "",
        "| system | packed tokens/s | vs HF tokenizer | first batch | after the first batch | stall share "
        "| longest wait | peak RSS | padding |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system, rate, first, stall, wait, rss, padding, after, pss in rows:
        cells = [
            f"{rate / 1e6:.2f}M", f"{rate / limit:.2f}x", _fmt(first, "{:.2f} s"),
            _fmt(after and after / 1e6, "{:.2f}M") + _fmt(after and after / limit, " ({:.2f}x)"),
            _fmt(stall, "{:.1%}"), _fmt(wait, "{:.2f} s"),
            _fmt(rss and rss / 2**30, "{:.2f} GiB") + (f" ({pss / 2**30:.2f})" if pss else ""),
            _fmt(padding, "{:.2%}"),
        ]  # fmt: skip
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    lines += _cores_per_gpu(rows)
    lines += [
        "",
        "Restore to first batch at 8 and 64 lanes: `benchmarks/results/restore.txt` "
        "(`python benchmarks/restore.py`).",
        "",
        "Checkpoint bytes after 40 batches (zephon: per lane, its largest; the others have no lanes:",
        "their whole state for the one rank), JSON or pickle as each system stores it:",
        "",
        *(f"- {system}: {_fmt(size, '{:,} bytes')}" for system, size in extras.items()),
    ]
    write_result(f"{args.out}.md", lines, echo=False)
    record = {"runs": runs, "stalls": stalls, "extras": extras, "limit": limit}
    record.update(tokens=args.tokens, reps=args.reps, stall_tokens=args.stall_tokens)
    record["stall_reps"], record["copies"], record["sizes"] = args.stall_reps, args.copies, args.sizes
    write_json(f"{args.out}.json", record)
    _plot(rows, limit, result_path(f"{args.out}.png"))
    print("\n".join(lines))


def _cores_per_gpu(rows) -> list[str]:
    """CPU cores of this machine it takes to keep one GPU fed, per model size."""
    ours = {name: max((r for r in rows if r[0].startswith("zephon ") and "0.2.0" not in r[0]
                       and name in r[0]), key=lambda r: r[1], default=None)
            for name in ("HF tokenizers", "fastokens")}  # fmt: skip
    lines = ["", "Cores per GPU: what one GPU consumes over this project's best rate per CPU core here", ""]
    lines += ["| model (source) | GPU tokens/s | " + " | ".join(f"cores per GPU, {n}" for n in ours) + " |"]
    lines += ["|---|---:|" + "---:|" * len(ours)]
    for model, gpu in GPU_TOKENS_PER_S.items():
        cells = [_fmt(r and gpu / (r[1] / CORES), "{:.4f}") for r in ours.values()]
        lines.append(f"| {model} | {gpu:,} | " + " | ".join(cells) + " |")
    best = "; ".join(
        f"{n}: {r[0]}, {r[1] / CORES / 1e6:.2f}M tokens/s per core" for n, r in ours.items() if r
    )
    return [*lines, "", f"(best rate per core: {best})"]


def _median_of(results) -> dict:
    """Medians, key by key, of one system's stall runs (an older results file holds one run)."""
    if not results:
        return {}
    results = [results] if isinstance(results, dict) else results
    return {k: statistics.median(r[k] for r in results) for k in ("stall_share", "longest_wait")}


def _fmt(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _plot(rows, limit: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r[1])
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
    colors = ["C2" if r[0].startswith("zephon ") and "0.2.0" not in r[0] else "C7" for r in rows]
    ax.barh([r[0] for r in rows], [r[1] / 1e6 for r in rows], color=colors)
    ax.axvline(limit / 1e6, color="k", ls="--", lw=1, label="HF tokenizers alone")
    ax.set_xlabel("packed tokens/s, end to end (millions), 2 CPU cores")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
