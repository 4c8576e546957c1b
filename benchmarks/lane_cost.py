#!/usr/bin/env python
"""The lane's own CPU per million tokens: what a rank process does whatever its workers do.

With the process runner a rank process keeps only the lane's work (mixing, packing, the shuffle,
batches and their delivery) and receiving the workers' results; that work bounds what one rank
process delivers, whatever its cores (``benchmarks/results/profile_corpus.md``: ``P``). This
measures it alone: the throughput benchmark's recipe (``benchmarks/peers/zephon_self.py``, inline)
over the corpus (each dataset's text written ``--copies`` times), once to read and tokenize every
chunk it needs, keeping each chunk's result, then ``--reps`` more times from the start with those
results handed back at once: the process CPU time of each such run over its tokens. The
benchmark's loop (summing the valid tokens of each batch) counts too, as a trainer's own would.

Compare two checkouts side by side, alternating (this machine's speed moves between minutes);
``--root`` runs another checkout's zephon under this benchmark:

    python benchmarks/lane_cost.py [--tokens 10000000 --reps 7 --copies 16] [--root OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
from benchmarks.common import refuse_fewer_than_one_copy  # noqa: E402


def measure(tokens: int, reps: int, copies: int) -> list[float]:
    """Core-milliseconds per million tokens of each of ``reps`` runs over kept chunk results."""
    import zephon.lanes
    from benchmarks.common import text_setup
    from benchmarks.peers import zephon_self

    kept: dict = {}
    work = zephon.lanes.ChunkWork.__call__

    def once_per_chunk(self, chunk):
        if chunk not in kept:
            kept[chunk] = work(self, chunk)
        return kept[chunk]

    zephon.lanes.ChunkWork.__call__ = once_per_chunk
    with tempfile.TemporaryDirectory() as tmp:
        setup = text_setup(tmp, copies, method="inline", workers=0, options={"backend": "auto"})

        def run() -> float:
            n, start = 0, time.process_time()
            for out in zephon_self.batches(setup):
                n += int(out.valid.sum())
                if n >= tokens:
                    break
            return (time.process_time() - start) / n * 1e9

        run()  # reads and tokenizes every chunk the runs need
        return [run() for _ in range(reps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--copies", type=int, default=16)
    parser.add_argument("--root", default=HERE, help="the checkout to measure (default: this one)")
    args = parser.parse_args()
    if args.tokens < 1 or args.reps < 1:
        parser.error(f"--tokens {args.tokens} --reps {args.reps}: give 1 or more of each")
    refuse_fewer_than_one_copy(parser, args.copies)
    sys.path.insert(0, os.path.abspath(args.root))  # its zephon (this checkout's benchmark code)
    costs = sorted(measure(args.tokens, args.reps, args.copies))
    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, {args.root}: the lane's CPU, "
        f"{args.tokens:,} tokens a run: median {costs[len(costs) // 2]:.2f} core-ms per M tokens, "
        f"least {costs[0]:.2f} (runs: {', '.join(f'{c:.2f}' for c in costs)})"
    )


if __name__ == "__main__":
    main()
