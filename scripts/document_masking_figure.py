#!/usr/bin/env python
"""Loss curves of the debug model on the debug recipe with and without document masking (CPU).

TorchTitan's llama3 debug model (flex attention through zephon's CPU kernels) on the debug recipe
(KJV verses, a 2,048-token BPE; rows of 128 tokens hold about 4 verses), 2 ranks, global batch
16, ``--steps`` steps from the same initial weights: once with document masking (the default:
positions restart at every document, TorchTitan masks attention per document) and once with
``--dataloader.document_mask False`` (positions count the whole row: each token attends to the
documents before it in its row). The tokens of every step are the same; only the positions, and
so the masks and rotary positions, differ. Writes docs/document_masking.png and .txt.

    python scripts/document_masking_figure.py [--steps 40]   # about 4 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from train_jobs import ROOT, run_train

from zephon.testing import logged_losses

RUNS = {
    "document masking (default)": [],
    "no document masking": ["--dataloader.document_mask", "False"],
}


def train(name: str, args: list[str], dump: str, steps: int) -> dict[int, float]:
    start = time.monotonic()
    rc, log = run_train(2, dump, "--training.steps", str(steps), "--checkpoint.interval", "100000", *args,
                        timeout=None)  # fmt: skip
    if rc != 0:
        sys.exit(f"training ({name}) failed:\n{log[-4000:]}")
    losses = logged_losses(log)
    print(f"  {name}: {len(losses)} steps in {time.monotonic() - start:.0f}s", flush=True)
    return losses


def table(results: dict[str, dict[int, float]], steps: int) -> list[str]:
    tail = range(steps - 9, steps + 1)
    lines = [
        f"llama3 debug model, debug recipe, 2 ranks (CPU, gloo), global batch 16 x 128, {steps} steps,",
        "float32 parameters, the same initial weights; flex attention with TorchTitan's per-document",
        "masks (zephon's CPU kernels). The same tokens every step; only the positions differ.",
        "Command: python scripts/document_masking_figure.py",
        "",
        f"{'run':<28} {'loss at step ' + str(steps):>16} {'mean of the last 10':>20}",
    ]
    for name, loss in results.items():
        lines.append(f"{name:<28} {loss[steps]:>16.5f} {sum(loss[s] for s in tail) / 10:>20.5f}")
    lines += ["", "step | " + " | ".join(results)]
    for s in range(1, steps + 1):
        lines.append(f"{s:>4} | " + " | ".join(f"{loss[s]:.5f}" for loss in results.values()))
    return lines


def plot(results: dict[str, dict[int, float]], steps: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, low) = plt.subplots(2, 1, figsize=(7, 5), height_ratios=[3, 1.3], sharex=True)
    for i, (name, loss) in enumerate(results.items()):
        ax.plot(sorted(loss), [loss[s] for s in sorted(loss)], color=f"C{i}", label=name)
    ax.set_ylabel("training loss")
    ax.set_xlim(1, steps)
    ax.legend()
    ax.set_title("llama3 debug model on KJV verses (CPU): with and without document masks", fontsize=10)
    masked, unmasked = results.values()
    low.bar(range(1, steps + 1), [masked[s] - unmasked[s] for s in range(1, steps + 1)], color="C0")
    low.axhline(0, color="grey", linewidth=0.8)
    low.set_ylabel("masked - not", fontsize=9)
    low.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "document_masking"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {
            name: train(name, extra, os.path.join(tmp, f"run{i}"), args.steps)
            for i, (name, extra) in enumerate(RUNS.items())
        }
    lines = table(results, args.steps)
    with open(args.out + ".txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[:8]))
    plot(results, args.steps, args.out + ".png")


if __name__ == "__main__":
    main()
