#!/usr/bin/env python
"""The lane's mixer and wrap packer alone: microseconds a piece, on the benchmark's real data.

The mixer (which dataset a lane takes its next document from, ``zephon.work.mixture``) runs in
the rank process for every piece a row is made of, whatever the runner: with process workers it
is most of the rank process's own work, the bound on one rank process however many cores it
has (``benchmarks/results/profile_corpus.md``). This script runs the throughput benchmark's
pipeline inline (the three-dataset token mixture, GPT-2 BPE, 8 lanes, rows of 2,049) until
``--tokens`` tokens, keeping the tokenized chunks lane 0's mixer fetched, then replays lane 0's
mixer and ``wrap`` over them alone (no reading, no tokenizing: the chunks are at hand), windows of
256 rows, ``--reps`` times, and reports the best time per piece and per million tokens, with a
digest of the pieces taken (dataset, document, start, stop): a change to the mixer that keeps
the digest takes the same pieces. With ``--against`` another checkout's mixer (``git worktree
add``) replays the same recorded chunks, each replay in a fresh process, the two alternated.
Writes ``benchmarks/results/mixer.txt``.

    python benchmarks/mixer.py [--tokens 40000000 --copies 16 1 --reps 7] [--against ../before]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def record(tokens: int, copies: int) -> tuple:
    """Lane 0's mix rule, its ``max_empty`` and every chunk its mixer fetched, by (dataset,
    chunk, record), from an inline run of the benchmark's pipeline."""
    from benchmarks.common import text_setup
    from benchmarks.peers import zephon_self
    from zephon.work import mixture

    kept: dict = {}
    init = mixture.Mixer.__init__

    def keeping(self, rule, fetch, state, max_empty, fresh=False):
        if not kept:  # lane 0's mixer: the first one made
            kept.update(rule=rule, max_empty=max_empty, heads={})

            def fetch_and_keep(d, chunk, record):
                kept["heads"][(d, chunk, record)] = head = fetch(d, chunk, record)
                return head

            return init(self, rule, fetch_and_keep, state, max_empty, fresh)
        return init(self, rule, fetch, state, max_empty, fresh)

    mixture.Mixer.__init__ = keeping
    try:
        with tempfile.TemporaryDirectory() as tmp:
            setup = text_setup(tmp, copies, method="inline", options={"backend": "auto"})
            done = 0
            for out in zephon_self.batches(setup):
                done += int(out.valid.sum())
                if done >= tokens:
                    break
    finally:
        mixture.Mixer.__init__ = init
    return kept["rule"], kept["max_empty"], kept["heads"]


def replay(rule, max_empty, heads: dict, reps: int) -> dict:
    """Lane 0's mixer and wrap over the kept chunks, until it asks for one it did not fetch."""
    from zephon.ops.pack import wrap
    from zephon.work.mixture import Mixer, MixState

    def fetch(d, chunk, record):
        return heads[(d, chunk, record)]

    best = None
    for _ in range(reps):
        mixer = Mixer(rule, fetch, MixState.start(len(rule.shares)), max_empty, True)
        digest, pieces, tokens, took = hashlib.sha256(), 0, 0, 0.0
        try:
            while True:  # only whole windows are timed and counted
                began = time.perf_counter()
                taken, lengths = wrap(mixer, 256, 2049)
                took += time.perf_counter() - began
                pieces, tokens = pieces + len(taken), tokens + sum(lengths)
                digest.update(repr([(p.dataset, p.doc, p.start, p.stop) for p in taken]).encode())
        except KeyError:  # past what the recorded run fetched: the window it was making is left out
            pass
        best = took if best is None else min(best, took)
    return {"pieces": pieces, "tokens": tokens, "seconds": best, "digest": digest.hexdigest()[:16]}


def _child(args) -> None:
    """One step in a fresh process: record the chunks into a file, or replay them (this
    process imports zephon from the checkout named)."""
    kind, *rest = args
    if kind == "record":
        copies, tokens, path = rest
        with open(path, "wb") as f:
            pickle.dump(record(int(tokens), int(copies)), f)
        return
    checkout, path, reps = rest
    sys.path.insert(0, checkout)
    with open(path, "rb") as f:
        rule, max_empty, heads = pickle.load(f)
    print(json.dumps(replay(rule, max_empty, heads, int(reps))), flush=True)


def _commit(checkout: str) -> str:
    """The checkout's commit, and whether its files differ from it."""
    git = ["git", "-C", checkout]
    commit = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return (commit or "not a git checkout") + (" with changes" if dirty.stdout.strip() else "")


def _run(*args: str) -> str:
    command = [sys.executable, os.path.abspath(__file__), "--child", *args]
    return subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=40_000_000, help="tokens of the recorded run")
    parser.add_argument("--copies", type=int, nargs="+", default=[16, 1], help="as throughput.py's")
    parser.add_argument("--reps", type=int, default=7, help="fresh processes per checkout, alternated")
    parser.add_argument("--against", help="another checkout whose mixer replays the same chunks")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)  # benchmarks.common and benchmarks.peers, from a source checkout
    if args.child:
        _child(args.child)
        return
    from benchmarks.common import refuse_fewer_than_one_copy, write_result

    for copies in args.copies:
        refuse_fewer_than_one_copy(parser, copies)
    checkouts = {f"this checkout ({_commit(ROOT)})": ROOT}
    if args.against:
        checkouts[f"--against ({_commit(args.against)})"] = os.path.abspath(args.against)
    command = f"python benchmarks/mixer.py --tokens {args.tokens} --copies {' '.join(map(str, args.copies))} "
    command += f"--reps {args.reps}" + (f" --against {args.against}" if args.against else "")
    lines = [
        "# The lane's mixer and wrap packer alone",
        "",
        f"`{command}` on {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}: "
        "lane 0's mixer and wrap (rows of 2,049, windows of 256 rows) replayed over the chunks it "
        "fetched in an inline run of the throughput benchmark's pipeline; the best of 3 replays in "
        f"each of {args.reps} fresh processes per checkout, the checkouts alternated.",
        "",
        "| data | mixer | pieces | tokens | us per piece | core-s per M tokens | vs this checkout | digest |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for copies in args.copies:
            path = os.path.join(tmp, f"chunks{copies}.pickle")
            _run("record", str(copies), str(args.tokens), path)
            best: dict[str, dict] = {}
            for _ in range(args.reps):
                for name, checkout in checkouts.items():
                    r = json.loads(_run("replay", checkout, path, "3").strip().splitlines()[-1])
                    if not r["pieces"]:
                        parser.error(
                            f"--tokens {args.tokens}: lane 0 fetched too little to make one window of 256 "
                            "rows of 2,049 tokens (the run spreads its tokens over 8 lanes): give at least "
                            "10000000"
                        )
                    if name not in best or r["seconds"] < best[name]["seconds"]:
                        best[name] = r
            data = f"text written {copies} times over" if copies > 1 else "text written once"
            ours = best[next(iter(checkouts))]["seconds"]
            for name, r in best.items():
                lines.append(
                    f"| {data} | {name} | {r['pieces']:,} | {r['tokens']:,} | "
                    f"{r['seconds'] / r['pieces'] * 1e6:.2f} | {r['seconds'] / r['tokens'] * 1e6:.4f} | "
                    f"{r['seconds'] / ours:.2f}x | {r['digest']} |"
                )
                print(lines[-1], flush=True)
    write_result("mixer.txt", lines)


if __name__ == "__main__":
    main()
