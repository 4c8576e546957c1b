"""Replay one optimizer step's global batch: what exactly a step trained on.

::

    python -m zephon.replay --job train_configs/llama3_debug.toml --step 7 [--dump_folder DIR]
    python -m zephon.replay --recipe zephon_recipes/debug.toml --global-batch-size 16 \\
        --seq-len 128 --local-batch-size 2 --step 7
    ... [--checkpoint DIR] [--out step7.npz] [--tokens 12] [--section.field value ...]

With ``--job``, further ``--section.field value`` arguments are the run's command-line overrides
(e.g. ``--dataloader.skip_steps 3-4``): give the ones that shaped the run's data.

Prints the step's digest (the one the training run wrote to ``batch_digests.jsonl``) and, for
each row, its lane, batch index, row, source datasets (tokens of each) and first tokens decoded.
``--out`` writes the global batch as ``.npz`` (``tokens``, ``positions``, ``sources``, ``lanes``,
``indices``, ``datasets``).

The stream of each lane does not depend on the DP size, so the replay runs every lane in this
process, DP size 1. It starts from the job's latest checkpoint before the step (``step-K`` under
``<dump_folder>/<checkpoint.folder>``, or ``--checkpoint``) when there is one, else from the
start, and logs its progress while it makes the steps in between. With ``[data] skip_steps`` in
the job, ``--step`` is the training step, and the replay skips the data the run skipped.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import re
import sys
from dataclasses import dataclass

import numpy as np

from zephon.batch import Batch, batches_per_lane, global_step_digest
from zephon.progress import Progress

log = logging.getLogger("zephon.replay")


@dataclass
class Setup:
    """What the replay needs of a job: its recipe, batch geometry and checkpoints."""

    recipe: str
    overrides: dict
    seq_len: int
    local_batch_size: int
    global_batch_size: int
    checkpoints: str | None  # the folder of step-K checkpoints, if any
    skip_steps: tuple[str, ...] = ()  # the job's [data] skip_steps


def from_job(path: str, dump_folder: str | None, overrides: list[str] = ()) -> Setup:
    """The replay setup of a TorchTitan job config, with the run's command-line ``overrides``
    (``--dataloader.skip_steps 3-4`` ...)."""
    from zephon.torchtitan import cpu

    cpu.install()  # TorchTitan's config module picks the device on import
    from zephon.torchtitan.job import ZephonConfigManager

    args = ["--job.config_file", path] + (["--dump_folder", dump_folder] if dump_folder else [])
    args += list(overrides)
    config = ZephonConfigManager().parse_args(args)
    loader = config.dataloader
    overrides = {
        "recipe": {k: getattr(loader, k) for k in ("num_lanes", "seed")},
    }
    folder = os.path.join(config.dump_folder, config.checkpoint.folder)
    return Setup(
        loader.recipe, overrides, config.training.seq_len, config.training.local_batch_size,
        config.training.global_batch_size, folder, tuple(getattr(loader, "skip_steps", ()) or ()),
    )  # fmt: skip


def checkpoint_before(folder: str | None, step: int) -> tuple[int, str] | None:
    """The latest ``step-K`` checkpoint in ``folder`` with K < ``step``: (K, its path)."""
    if not folder or not os.path.isdir(folder):
        return None
    found = []
    for path in glob.glob(os.path.join(folder, "step-*")):
        match = re.fullmatch(r"step-(\d+)", os.path.basename(path))
        if match and int(match.group(1)) < step and os.path.isdir(path):
            found.append((int(match.group(1)), path))
    return max(found) if found else None


def loader_state(path: str) -> dict[str, str]:
    """The zephon dataloader entries of the DCP checkpoint at ``path``, read in this process."""
    import warnings

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    keys = {
        k for k in FileSystemReader(path).read_metadata().state_dict_metadata if k.startswith("dataloader.")
    }
    if not keys:
        raise ValueError(
            f"checkpoint {path} holds no dataloader state (was it saved with model weights only?)"
        )
    with warnings.catch_warnings():  # "no process group: loading in a single process" is the intent
        warnings.simplefilter("ignore", UserWarning)
        return _load_state_dict_from_keys(keys=keys, checkpoint_id=path)["dataloader"]


def replay(setup: Setup, step: int) -> tuple[list[Batch], object, str]:
    """Step ``step``'s batches (1-based, in delivery order), the pipeline, and where it began."""
    from zephon.torchtitan.dataloader import ZephonDataLoader

    if step < 1:
        raise ValueError(f"--step {step}: steps count from 1")
    config = ZephonDataLoader.Config(
        recipe=setup.recipe, global_batch_size=setup.global_batch_size, skip_steps=list(setup.skip_steps),
        **setup.overrides["recipe"],
    )  # fmt: skip
    loader = ZephonDataLoader(
        config, dp_world_size=1, dp_rank=0, seq_len=setup.seq_len, local_batch_size=setup.local_batch_size
    )
    pipeline = loader.pipeline
    per_lane = batches_per_lane(setup.global_batch_size, pipeline.opts.num_lanes, setup.local_batch_size)
    per_step = per_lane * pipeline.opts.num_lanes
    start, began = 0, "the start of the run"
    found = checkpoint_before(setup.checkpoints, step)
    if found is not None:
        start, path = found
        loader.load_state_dict(loader_state(path))
        began = f"checkpoint {path}"
    skip = 0  # batches to make and drop: the steps between, and the data of skipped steps
    for t in range(start + 1, step + 1):
        due = loader.skips.due(t)
        if due is not None:
            loader.skips.apply(due)
            skip += (due[1] - due[0] + 1) * per_step
        skip += per_step if t < step else 0
    data_step = step + loader.skips.data_steps
    if data_step != step:
        began += f"; step {step} trains on the data of step {data_step} of a run without skips"
    it = iter(pipeline)
    progress = Progress(f"replay: steps {start + 1}-{step - 1} before step {step}", skip, "batches")
    for _ in range(skip):
        next(it)
        progress.update()
    batches = [next(it) for _ in range(per_step)]
    pipeline.close()
    first = {b.index // per_lane for b in batches}
    if first != {data_step - 1}:  # a checkpoint from another schedule would shift the indices
        raise RuntimeError(
            f"replay reached the data of steps {sorted(s + 1 for s in first)}, not {data_step}"
        )
    return batches, pipeline, began


def describe(batches: list[Batch], pipeline, tokens: int) -> list[str]:
    """One line per row: lane, batch index, row, datasets (tokens of each), first tokens."""
    names = pipeline.dataset_names
    decode = _decoder(pipeline)
    lines = [f"{'lane':>5} {'index':>6} {'row':>4}  {'datasets (tokens)':<28} first tokens"]
    for b in sorted(batches, key=lambda b: (b.lane, b.index)):
        for row in range(b.tokens.shape[0]):
            counts: dict[str, int] = {}
            for source, a, z in b.source_spans(row):
                name = names[source] if source >= 0 else "padding"
                counts[name] = counts.get(name, 0) + (z - a)
            sources = ", ".join(f"{k} {v}" for k, v in counts.items())
            text = decode([int(t) for t in b.tokens[row, :tokens]])
            lines.append(f"{b.lane:>5} {b.index:>6} {row:>4}  {sources:<28} {text!r}")
    return lines


def _decoder(pipeline):
    from zephon.ops.tokenize import Tokenize

    op = next((op for op in pipeline._ops if isinstance(op, Tokenize)), None)
    if op is None:
        return lambda ids: " ".join(map(str, ids))
    return op.tokenizer().decode


def save(path: str, batches: list[Batch], pipeline) -> None:
    ordered = sorted(batches, key=lambda b: (b.lane, b.index))
    np.savez(
        path,
        tokens=np.stack([b.tokens for b in ordered]),
        positions=np.stack([b.positions for b in ordered]),
        sources=np.stack([b.sources for b in ordered]),
        lanes=np.array([b.lane for b in ordered]),
        indices=np.array([b.index for b in ordered]),
        datasets=np.array(pipeline.dataset_names),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zephon.replay", description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--job", help="a TorchTitan job config (train_configs/NAME.toml)")
    what.add_argument("--recipe", help="a data recipe (zephon_recipes/NAME.toml), with the batch geometry")
    parser.add_argument("--step", type=int, required=True, help="the optimizer step, from 1")
    parser.add_argument("--dump_folder", help="the job's dump folder (default: the job config's)")
    parser.add_argument("--checkpoint", help="a folder of step-K checkpoints (default: the job's)")
    parser.add_argument("--global-batch-size", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--local-batch-size", type=int)
    parser.add_argument("--out", help="write the global batch to this .npz file")
    parser.add_argument("--tokens", type=int, default=12, help="tokens of each row to decode (default 12)")
    args, overrides = parser.parse_known_args(argv)
    if overrides and not args.job:
        parser.error(f"unrecognized arguments: {' '.join(overrides)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.job:
        setup = from_job(args.job, args.dump_folder, overrides)
    else:
        missing = [
            n for n in ("global_batch_size", "seq_len", "local_batch_size") if getattr(args, n) is None
        ]
        if missing:
            parser.error("--recipe needs " + ", ".join("--" + n.replace("_", "-") for n in missing))
        setup = Setup(
            args.recipe, {"recipe": {}}, args.seq_len, args.local_batch_size, args.global_batch_size, None
        )
    if args.checkpoint:
        setup.checkpoints = args.checkpoint
    batches, pipeline, began = replay(setup, args.step)
    digest = global_step_digest(batches)
    print(f"step {args.step}: digest {digest}")
    print(f"  {len(batches)} batches of {batches[0].tokens.shape[0]} rows, replayed from {began}")
    for line in describe(batches, pipeline, args.tokens):
        print("  " + line)
    if args.out:
        save(args.out, batches, pipeline)
        print(f"  wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
