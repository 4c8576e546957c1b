#!/usr/bin/env python
"""Figure 2 on CPU: the same job from scratch on 1, 2 and 4 ranks, TorchTitan's loader vs zephon.

TorchTitan's llama3 debug model on the debug recipe (KJV verses), global batch 16 x 128 tokens on
every rank count, float32 parameters, trained from scratch for ``--steps`` steps on 1, 2 and 4
processes: once with TorchTitan 0.3.0's own text loader on the same data (each rank reads its own
shard of it) and once with zephon. Every run starts from the same initial weights, a seed
checkpoint made once (TorchTitan's ``--checkpoint.create_seed_checkpoint``): TorchTitan's own
initialization of a sharded model depends on the rank count, which would hide what the data does.
Writes docs/gpu_count_spread.png (loss curves per rank count for each loader, and per step
whether the global batch is the same on every rank count) and docs/gpu_count_spread.txt (final
losses, their spread per loader, steps whose global batches agree on all rank counts).

    python scripts/gpu_count_spread.py [--steps 40]   # about 10 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from train_jobs import (
    CONFIG,
    ROOT,
    by_step,
    default_loader_config,
    digest_lines,
    draw_barcode,
    run_train,
)

from zephon.testing import logged_losses

RANKS = (1, 2, 4)
LOADERS = {"torchtitan": "TorchTitan 0.3.0's own loader", "zephon": "zephon"}


def train(
    ngpu: int, config: str, dump: str, steps: int, seed: str
) -> tuple[dict[int, float], dict[int, str]]:
    start = time.monotonic()
    args = [
        "--training.steps",
        str(steps),
        "--checkpoint.initial_load_path",
        seed,
        "--checkpoint.interval",
        "100000",
    ]
    rc, log = run_train(ngpu, dump, *args, config=config, timeout=None)
    if rc != 0:
        sys.exit(f"training on {ngpu} rank(s) with {config} failed:\n{log[-4000:]}")
    losses, digests = logged_losses(log), by_step(digest_lines(dump))
    print(f"  {ngpu} rank(s): {len(losses)} steps in {time.monotonic() - start:.0f}s", flush=True)
    return losses, digests


def seed_checkpoint(folder: str) -> str:
    """The initial weights every run starts from, made once on one rank."""
    rc, log = run_train(
        1, folder, "--checkpoint.create_seed_checkpoint", "--training.steps", "1", timeout=None
    )
    if rc != 0:
        sys.exit(f"creating the seed checkpoint failed:\n{log[-4000:]}")
    return os.path.join(folder, "checkpoint", "step-0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "gpu_count_spread"))
    args = parser.parse_args()
    results: dict[str, dict[int, tuple]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        configs = {
            "torchtitan": default_loader_config(os.path.join(tmp, "torchtitan.toml")),
            "zephon": os.path.join(ROOT, CONFIG),
        }
        seed = seed_checkpoint(os.path.join(tmp, "seed"))
        for name, config in configs.items():
            print(f"{LOADERS[name]}:", flush=True)
            results[name] = {
                n: train(n, config, os.path.join(tmp, f"{name}-{n}"), args.steps, seed) for n in RANKS
            }
    lines = table(results, args.steps)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(results, args.steps, args.out + ".png")


def agreeing_steps(runs: dict[int, tuple], steps: int) -> list[bool]:
    """Per step: whether every rank count trained on the 1-rank run's global batch."""
    reference = runs[RANKS[0]][1]
    return [all(runs[n][1].get(s) == reference.get(s) for n in RANKS) for s in range(1, steps + 1)]


def table(results: dict, steps: int) -> list[str]:
    lines = [
        f"llama3 debug model from scratch, debug recipe, global batch 16 x 128 tokens, {steps} steps,",
        "float32 parameters, CPU (gloo); every run from the same seed checkpoint.",
        "Command: python scripts/gpu_count_spread.py",
        "",
        f"{'loader':<30} {'final loss on 1 / 2 / 4 ranks':<30} {'final spread':>12} "
        f"{'largest spread, any step':>24} {'steps with the same global batch':>33}",
    ]
    for name, runs in results.items():
        finals = [runs[n][0][steps] for n in RANKS]
        spreads = [
            max(runs[n][0][s] for n in RANKS) - min(runs[n][0][s] for n in RANKS) for s in range(1, steps + 1)
        ]
        same = sum(agreeing_steps(runs, steps))
        lines.append(
            f"{LOADERS[name]:<30} {' / '.join(f'{x:.5f}' for x in finals):<30} "
            f"{max(finals) - min(finals):>12.5f} {max(spreads):>24.5f} {f'{same} of {steps}':>33}"
        )
    lines += ["", "step | " + " | ".join(f"{LOADERS[n]}: loss 1 / 2 / 4 ranks" for n in results)]
    for s in range(1, steps + 1):
        cells = [" / ".join(f"{runs[n][0][s]:.5f}" for n in RANKS) for runs in results.values()]
        lines.append(f"{s:>4} | " + " | ".join(cells))
    return lines


def plot(results: dict, steps: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 5.5), height_ratios=[3, 1], sharex=True)
    for col, (name, runs) in enumerate(results.items()):
        ax = axes[0, col]
        for i, n in enumerate(RANKS):
            loss = runs[n][0]
            ax.plot(sorted(loss), [loss[s] for s in sorted(loss)], color=f"C{i}", lw=1.5 if i else 2.5,
                    ls="-" if i == 0 else "--", label=f"{n} rank(s)")  # fmt: skip
        finals = [runs[n][0][steps] for n in RANKS]
        ax.set_title(f"{LOADERS[name]}: final-loss spread {max(finals) - min(finals):.5f}", fontsize=10)
        ax.set_ylabel("loss")
        ax.legend(fontsize=8)
        same = dict(enumerate(agreeing_steps(runs, steps), start=1))
        xlabel = "step (green: the same global batch on 1, 2 and 4 ranks; red: not)"
        draw_barcode(axes[1, col], {"1 = 2 = 4\nranks": same}, steps, xlabel)
    fig.suptitle("The same job from scratch on 1, 2 and 4 GPUs: same data? (llama3 debug model, CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
