#!/usr/bin/env python
"""Where this project's time goes: py-spy samples of the throughput benchmark's pipeline.

Runs ``benchmarks/peers/zephon_self.py`` (the three-dataset token mixture, GPT-2 BPE, 8 lanes,
pack_flat(2048), shuffle 256, microbatch 8) under ``py-spy record`` for ``--tokens`` tokens, with
the given runner, workers and tokenizer backend, and writes the functions that hold the GIL
most (``--gil``: CPU spent in Python or in C called with the GIL held), inclusive and own, to
benchmarks/results/profile.md.

    python benchmarks/time_profile.py [--runner thread --workers 2 --backend auto --tokens 16000000]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args: argparse.Namespace) -> None:
    """The profiled process: the benchmark's pipeline until enough tokens."""
    sys.path.insert(0, ROOT)
    from benchmarks.common import MIXTURE
    from benchmarks.peers import zephon_self
    from benchmarks.peers.common import Setup
    from zephon.testing import gpt2_tokenizer_dir
    from zephon.testing.data import real_text_corpora

    with tempfile.TemporaryDirectory() as tmp:
        files = {name: path for name, (path, _) in real_text_corpora(tmp).items()}
        setup = Setup(files, MIXTURE, gpt2_tokenizer_dir(os.path.join(tmp, "gpt2")), method=args.runner,
                      workers=args.workers, options={"backend": args.backend})  # fmt: skip
        done = 0
        for out in zephon_self.batches(setup):
            done += int(out.valid.sum())
            if done >= args.tokens:
                break


def summarize(raw: str, top: int = 25) -> list[str]:
    inclusive, own, total = Counter(), Counter(), 0
    with open(raw) as f:
        for line in f:
            stack, count = line.rsplit(" ", 1)
            frames = [frame.split(" (")[0] for frame in stack.split(";")]
            total += int(count)
            own[frames[-1]] += int(count)
            for name in set(frames):
                inclusive[name] += int(count)
    lines = [f"{total} samples with the GIL held", "", "| inclusive | own | function |", "|---:|---:|---|"]
    for name, count in inclusive.most_common(top):
        lines.append(f"| {count / total:.1%} | {own[name] / total:.1%} | `{name}` |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runner", default="thread")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--tokens", type=int, default=16_000_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "profile.txt")
        options = ["--runner", args.runner, "--workers", str(args.workers), "--backend", args.backend]
        child = [sys.executable, os.path.abspath(__file__), "--child", *options, "--tokens", str(args.tokens)]
        subprocess.run(
            ["py-spy", "record", "--gil", "-r", "200", "-f", "raw", "-o", raw, "--", *child], check=True
        )
        lines = [
            "# Where the time goes",
            "",
            f"`python benchmarks/time_profile.py {' '.join(options)} --tokens {args.tokens}` on "
            f"{platform.machine()}, {os.cpu_count()} CPUs:",
            "py-spy, 200 samples/s, only threads holding the GIL (the main process; with the process",
            "runner, reading and tokenizing happen in the workers, not sampled here).",
            "",
            *summarize(raw),
        ]
    sys.path.insert(0, ROOT)
    from benchmarks.common import write_result

    write_result("profile.md", lines)


if __name__ == "__main__":
    main()
