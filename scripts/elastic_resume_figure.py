#!/usr/bin/env python
"""Figure 1 on CPU: resume on another GPU count, with TorchTitan's default loader and with zephon.

TorchTitan's llama3 debug model on the debug recipe (KJV verses). For each loader: a 2-rank
baseline of ``--steps`` steps with a checkpoint at ``--resume-at``; then the same job resumed
from that checkpoint on 1 and on 4 ranks. TorchTitan's default loader refuses its own state on
another rank count, so its resumed runs exclude it (``--checkpoint.exclude_from_loading
dataloader``), which is what users are left to do. Plots loss curves and, per step, whether the
global batch matches the baseline's (digest), into docs/elastic_resume.png, with the numbers in
docs/elastic_resume.txt.

    python scripts/elastic_resume_figure.py [--steps 16 --resume-at 8]   # ~4 minutes on 2 cores
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


def run(ngpu: int, config: str, dump: str, *args: str) -> dict[int, float]:
    start = time.monotonic()
    rc, log = run_train(ngpu, dump, *args, config=config, timeout=None)
    if rc != 0:
        sys.exit(f"{ngpu} rank(s) {' '.join(args)} failed:\n{log[-4000:]}")
    found = logged_losses(log)
    print(
        f"  {ngpu} rank(s) {' '.join(args)}: {len(found)} steps in {time.monotonic() - start:.0f}s",
        flush=True,
    )
    return found


def digests(dump: str, skip: int = 0) -> dict[int, str]:
    return by_step(digest_lines(dump)[skip:])


def experiment(name: str, config: str, tmp: str, steps: int, k: int) -> dict:
    print(f"{name}:", flush=True)
    dump = os.path.join(tmp, name)
    common = ["--training.steps", str(steps), "--checkpoint.interval", str(k)]
    result = {"baseline": (run(2, config, dump, *common), digests(dump))}
    resume = [*common, "--checkpoint.load_step", str(k)]
    if name == "torchtitan":
        resume += ["--checkpoint.exclude_from_loading", "dataloader", "--dataloader.first_step", str(k + 1)]
    for ngpu in (1, 4):
        before = len(digests(dump))
        result[f"{ngpu}"] = (run(ngpu, config, dump, *resume), digests(dump, skip=before))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--resume-at", type=int, default=8)
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "elastic_resume"))
    args = parser.parse_args()
    steps, k = args.steps, args.resume_at
    with tempfile.TemporaryDirectory() as tmp:
        default = default_loader_config(os.path.join(tmp, "torchtitan.toml"))
        results = {
            "torchtitan": experiment("torchtitan", default, tmp, steps, k),
            "zephon": experiment("zephon", os.path.join(ROOT, CONFIG), tmp, steps, k),
        }
    lines = _table(results, steps, k)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    _plot(results, steps, k, args.out + ".png")


def _table(results: dict, steps: int, k: int) -> list[str]:
    lines = [
        f"llama3 debug model, debug recipe, global batch 16 x 128 tokens; 2-rank baseline, resumed at {k}",
        "step | default loader: loss 2 ranks / 1 / 4, same batch | zephon: loss 2 ranks / 1 / 4, same batch",
    ]
    for s in range(k + 1, steps + 1):
        cells = []
        for name in ("torchtitan", "zephon"):
            r = results[name]
            (base_loss, base_dig) = r["baseline"]
            row = [f"{base_loss[s]:.5f}"] + [f"{r[n][0][s]:.5f}" for n in ("1", "4")]
            match = ["=" if r[n][1].get(s) == base_dig[s] else "x" for n in ("1", "4")]
            cells.append(" / ".join(row) + "  " + "".join(match))
        lines.append(f"{s:>4} | " + " | ".join(cells))
    return lines


def _plot(results: dict, steps: int, k: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 5.5), height_ratios=[3, 1], sharex=True)
    titles = {"torchtitan": "TorchTitan's default loader", "zephon": "zephon"}
    colors = {"baseline": "k", "1": "C0", "4": "C3"}
    for col, name in enumerate(("torchtitan", "zephon")):
        r = results[name]
        ax = axes[0, col]
        base_loss, base_dig = r["baseline"]
        ax.plot(
            sorted(base_loss),
            [base_loss[s] for s in sorted(base_loss)],
            color="k",
            lw=2,
            label="2 ranks, uninterrupted",
        )
        for n in ("1", "4"):
            loss = r[n][0]
            ax.plot(
                sorted(loss),
                [loss[s] for s in sorted(loss)],
                "o--",
                ms=3,
                color=colors[n],
                label=f"resumed at {k} on {n} rank(s)",
            )
        ax.axvline(k + 0.5, color="gray", lw=0.8, ls=":")
        ax.set_title(titles[name])
        ax.set_ylabel("loss")
        ax.legend(fontsize=8)
        same = {n: {s: r[n][1].get(s) == base_dig[s] for s in range(k + 1, steps + 1)} for n in ("1", "4")}
        rows = {"1 rank": same["1"], "4 ranks": same["4"]}
        xlabel = "step (green: same global batch as the baseline, red: different)"
        draw_barcode(axes[1, col], rows, steps, xlabel)
    fig.suptitle("Resume on another number of GPUs: same data? (llama3 debug model, CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
