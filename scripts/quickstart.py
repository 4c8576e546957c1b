#!/usr/bin/env python
"""The main job, as a user runs it: train, checkpoint, resume on another number of ranks.

TorchTitan's llama3 debug model on the debug recipe (KJV verses, a 2,048-token BPE), on CPU:

1. ``NGPU=2 ./run_train.sh --training.steps 8 --checkpoint.interval 4``: 8 steps on 2 ranks,
   a checkpoint at step 4;
2. ``NGPU=1 ./run_train.sh --training.steps 8 --checkpoint.load_step 4``: the same job resumed
   from step 4 on 1 rank.

Prints each resumed step's global batch digest and loss next to the 2-rank run's and exits 1 if
any batch differs. Outputs go to outputs/quickstart/ (removed first). About 2 minutes on 2 cores.

    python scripts/quickstart.py [--resume-ranks 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from train_jobs import CONFIG, ROOT, by_step, digest_lines, run_train

from zephon.testing import logged_losses


def train(ngpu: int, dump: str, *args: str) -> tuple[dict[int, float], dict[int, str]]:
    shown = os.path.relpath(dump, ROOT)
    print(
        f"$ NGPU={ngpu} CONFIG_FILE={CONFIG} ./run_train.sh --dump_folder {shown} {' '.join(args)}",
        flush=True,
    )
    before, start = len(digest_lines(dump)), time.monotonic()
    rc, log = run_train(ngpu, dump, *args, timeout=None)
    if rc != 0:
        sys.exit(f"training failed (exit {rc}):\n{log[-4000:]}")
    print(f"  done in {time.monotonic() - start:.0f}s", flush=True)
    return logged_losses(log), by_step(digest_lines(dump)[before:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resume-ranks", type=int, default=1, help="ranks of the resumed run")
    args = parser.parse_args()
    dump = os.path.join(ROOT, "outputs", "quickstart")
    shutil.rmtree(dump, ignore_errors=True)  # TorchTitan resumes from any checkpoint it finds there
    first = train(2, dump, "--training.steps", "8", "--checkpoint.interval", "4")
    second = train(args.resume_ranks, dump, "--training.steps", "8", "--checkpoint.load_step", "4")
    n = args.resume_ranks
    resumed = f"resumed on {n}"
    print(f"\nstep  {'global batch, 2 ranks':<24}  {resumed:<24}  {'loss, 2 ranks':>13}  {resumed:>13}")
    same = True
    for step in range(5, 9):
        a, b = first[1].get(step, "-"), second[1].get(step, "-")
        same &= a == b and a != "-"
        la, lb = first[0].get(step, float("nan")), second[0].get(step, float("nan"))
        mark = "same" if a == b else "DIFFERENT"
        print(f"{step:>4}  {a[:24]:<24}  {b[:24]:<24}  {la:>13.5f}  {lb:>13.5f}  {mark}")
    print(f"\n{'every resumed step trained on the same global batch' if same else 'MISMATCH'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
