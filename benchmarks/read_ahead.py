#!/usr/bin/env python
"""What the runners tokenize for what they deliver: the read-ahead that a short run never uses.

Runs the throughput benchmark's pipeline (``benchmarks/peers/zephon_self.py``: the three-dataset
token mixture, GPT-2 BPE, 8 lanes, pack_flat(2048), shuffle 256, microbatch 8, fastokens) inline
and with two thread workers, each in a fresh process, until ``--tokens`` tokens are delivered,
and reports the tokens its tokenize step made (counted around ``Tokenize.work`` in that process,
whatever became of them) per token delivered. The workers read ahead of the lane (chunks of the
lanes to come, so that a trainer never waits); a run stopped after a few million tokens leaves
that read-ahead unused, a long one uses it. (Process workers tokenize in their own processes,
out of this count's reach; they read ahead as far.) Writes ``benchmarks/results/read_ahead.txt``.

    python benchmarks/read_ahead.py [--tokens 8000000 40000000 200000000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNERS = (("inline", 1), ("thread", 2))


def child(runner: str, workers: int, tokens: int) -> None:
    """One run, in this fresh process: prints its delivered and tokenized tokens as JSON."""
    import threading

    from benchmarks.common import text_setup
    from benchmarks.peers import zephon_self
    from zephon.ops.tokenize import Tokenize

    made, lock, work = [0], threading.Lock(), Tokenize.work

    def counted(self, block):
        docs = work(self, block)
        with lock:
            made[0] += len(docs.tokens)
        return docs

    Tokenize.work = counted
    with tempfile.TemporaryDirectory() as tmp:
        setup = text_setup(tmp, method=runner, workers=workers, options={"backend": "auto"})
        p = zephon_self.pipeline(setup)
        done = 0
        try:
            for batch in p:
                done += int((batch.sources >= 0).sum())
                if done >= tokens:
                    break
        finally:
            p.close()
    print(json.dumps({"tokens": done, "tokenized": made[0]}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, nargs="+", default=[8_000_000, 40_000_000, 200_000_000])
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)  # benchmarks.common and benchmarks.peers, from a source checkout
    if args.child:
        runner, workers, tokens = args.child
        child(runner, int(workers), int(tokens))
        return
    from benchmarks.common import write_result

    lines = [
        "# What the runners tokenize for what they deliver",
        "",
        f"`python benchmarks/read_ahead.py --tokens {' '.join(map(str, args.tokens))}` on "
        f"{platform.machine()}, "
        f"{os.cpu_count()} CPUs: the throughput benchmark's pipeline (fastokens, 8 lanes, shuffle 256), each "
        "run in a fresh process, stopped once the tokens are delivered; the tokens its tokenize step "
        "made (used or not) per token delivered.",
        "",
        "| tokens delivered | runner | tokenized per token delivered | vs inline |",
        "|---:|---|---:|---:|",
    ]
    for tokens in args.tokens:
        inline = None
        for runner, workers in RUNNERS:
            command = [
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                runner,
                str(workers),
                str(tokens),
            ]
            done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
            run = json.loads(done.stdout.strip().splitlines()[-1])
            made = run["tokenized"] / run["tokens"]
            inline = inline or made
            name = "inline" if runner == "inline" else f"{runner} x{workers}"
            lines.append(f"| {run['tokens']:,} | {name} | {made:.2f} | {made / inline:.2f}x |")
            print(lines[-1], flush=True)
    write_result("read_ahead.txt", lines)


if __name__ == "__main__":
    main()
