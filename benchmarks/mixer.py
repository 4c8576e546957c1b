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
the digest takes the same pieces. Writes ``benchmarks/results/mixer.txt``.

    python benchmarks/mixer.py [--tokens 40000000 --copies 16 1 --reps 7]

To compare two checkouts, run each one's copy of this script (``git worktree add``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def record(tokens: int, copies: int) -> tuple:
    """Lane 0's mix rule, its ``max_empty`` and every chunk its mixer fetched, by (dataset,
    chunk, record), from an inline run of the benchmark's pipeline."""
    from benchmarks.common import MIXTURE, write_copies
    from benchmarks.peers import zephon_self
    from benchmarks.peers.common import Setup
    from zephon.testing import gpt2_tokenizer_dir
    from zephon.testing.data import real_text_corpora
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
            files = {name: path for name, (path, _) in real_text_corpora(tmp).items()}
            write_copies(files, copies)
            setup = Setup(files, MIXTURE, gpt2_tokenizer_dir(os.path.join(tmp, "gpt2")), method="inline",
                          options={"backend": "auto"})  # fmt: skip
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
        digest, pieces, tokens = hashlib.sha256(), 0, 0
        began = time.perf_counter()
        try:
            while True:
                taken, lengths = wrap(mixer, 256, 2049)
                pieces, tokens = pieces + len(taken), tokens + sum(lengths)
                digest.update(repr([(p.dataset, p.doc, p.start, p.stop) for p in taken]).encode())
        except KeyError:  # past what the recorded run fetched (the last window is left out)
            pass
        took = time.perf_counter() - began
        best = took if best is None else min(best, took)
    return {"pieces": pieces, "tokens": tokens, "seconds": best, "digest": digest.hexdigest()[:16]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=40_000_000, help="tokens of the recorded run")
    parser.add_argument("--copies", type=int, nargs="+", default=[16, 1], help="as throughput.py's")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)  # benchmarks.common and benchmarks.peers, from a source checkout
    from benchmarks.common import refuse_fewer_than_one_copy, write_result

    for copies in args.copies:
        refuse_fewer_than_one_copy(parser, copies)
    lines = [
        "# The lane's mixer and wrap packer alone",
        "",
        f"`python benchmarks/mixer.py --tokens {args.tokens} --copies {' '.join(map(str, args.copies))} "
        f"--reps {args.reps}` on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}: "
        "lane 0's mixer and wrap (rows of 2,049, windows of 256 rows) replayed over the chunks it "
        "fetched in an inline run of the throughput benchmark's pipeline; best of the reps.",
        "",
        "| data | pieces | tokens | us per piece | core-s per M tokens | pieces' digest |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for copies in args.copies:
        rule, max_empty, heads = record(args.tokens, copies)
        r = replay(rule, max_empty, heads, args.reps)
        data = f"text written {copies} times over" if copies > 1 else "text written once"
        lines.append(
            f"| {data} | {r['pieces']:,} | {r['tokens']:,} | {r['seconds'] / r['pieces'] * 1e6:.2f} | "
            f"{r['seconds'] / r['tokens'] * 1e6:.4f} | {r['digest']} |"
        )
        print(lines[-1], flush=True)
    write_result("mixer.txt", lines)


if __name__ == "__main__":
    main()
