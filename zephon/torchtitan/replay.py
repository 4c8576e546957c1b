"""Replay one optimizer step's global batch: what exactly a step trained on.

::

    python -m zephon.torchtitan.replay --job train_configs/llama3_debug.toml --step 7 [--dump_folder DIR]
    python -m zephon.torchtitan.replay --recipe zephon_recipes/debug.toml --global-batch-size 16 \\
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
start, and logs its progress (rate, ETA) while it makes the steps in between. With ``[data]
skip_steps`` in the job, ``--step`` is the training step, and the replay skips the data the run
skipped. A step past the data of datasets that stop is refused: at once where the bytes of their
files bound the steps (JSON lines, text), else as soon as a lane ends. What the replay cannot do
(a damaged checkpoint, a step past the data) is said in one line, exit status 1; a wrong
argument (``--step 0``, a ``--checkpoint`` folder that does not exist) exits 2.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import logging
import os
import re
import sys
from dataclasses import dataclass

import numpy as np

from zephon.batch import Batch, batches_per_lane, global_step_digest
from zephon.progress import Progress

log = logging.getLogger("zephon.torchtitan.replay")


@dataclass
class Setup:
    """What the replay needs of a job: its recipe, batch geometry and checkpoints."""

    recipe: str
    overrides: dict  # ZephonDataLoader.Config fields the job sets that shape the data
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
    from zephon.torchtitan.dataloader import PACKING_OVERRIDES
    from zephon.torchtitan.job import ZephonConfigManager

    args = ["--job.config_file", path] + (["--dump_folder", dump_folder] if dump_folder else [])
    args += list(overrides)
    config = ZephonConfigManager().parse_args(args)
    loader = config.dataloader
    overrides = {k: getattr(loader, k) for k in ("num_lanes", "seed", *PACKING_OVERRIDES)}
    folder = os.path.join(config.dump_folder, config.checkpoint.folder)
    return Setup(
        loader.recipe, overrides, config.training.seq_len, config.training.local_batch_size,
        config.training.global_batch_size, folder, tuple(getattr(loader, "skip_steps", ()) or ()),
    )  # fmt: skip


class ReplayError(ValueError):
    """What the replay cannot do, and what to do instead: the command prints it and exits 1."""


def checkpoint_before(folder: str | None, step: int, given: bool = False) -> tuple[int, str] | None:
    """The latest ``step-K`` checkpoint in ``folder`` with K < ``step``: (K, its path). ``folder``
    may be a ``step-K`` checkpoint itself. A ``given`` folder (``--checkpoint``) that does not exist
    or holds no ``step-K`` checkpoint is refused: else the replay would start from the start."""
    if not folder or not os.path.isdir(folder):
        if given:
            raise ReplayError(
                f"--checkpoint {folder}: no such folder; give the folder of the job's step-K checkpoints"
            )
        return None
    itself = re.fullmatch(r"step-(\d+)", os.path.basename(os.path.normpath(folder)))
    if itself and os.path.exists(os.path.join(folder, ".metadata")):
        found = [(int(itself.group(1)), folder)]
    else:
        found = []
        for path in glob.glob(os.path.join(folder, "step-*")):
            match = re.fullmatch(r"step-(\d+)", os.path.basename(path))
            if match and os.path.isdir(path):
                found.append((int(match.group(1)), path))
    if given and not found:
        raise ReplayError(
            f"--checkpoint {folder} holds no step-K checkpoint folder: give the folder that holds them "
            "(<dump_folder>/<checkpoint.folder>) or one step-K folder"
        )
    return max(((k, path) for k, path in found if k < step), default=None)


def loader_state(path: str) -> dict[str, str]:
    """The zephon dataloader entries of the DCP checkpoint at ``path``, read in this process."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        metadata = FileSystemReader(path).read_metadata()
    except Exception as e:
        raise _damaged(path, os.path.join(path, ".metadata"), e) from e
    keys = {k for k in metadata.state_dict_metadata if k.startswith("dataloader.")}
    if not keys:
        raise ReplayError(
            f"checkpoint {path} holds no dataloader state (was it saved with model weights only?): "
            "move it aside, and the replay starts from the checkpoint before it (or the start)"
        )
    try:
        with warnings.catch_warnings():  # "no process group: loading in a single process" is the intent
            warnings.simplefilter("ignore", UserWarning)
            state = {"dataloader": {key.split(".", 1)[1]: "" for key in keys}}  # the keys to read
            dcp.load(state, checkpoint_id=path)
            return state["dataloader"]
    except (Exception, CheckpointException) as e:  # DCP's own is a BaseException
        files = glob.glob(os.path.join(path, "*.distcp"))
        raise _damaged(path, files[0] if len(files) == 1 else os.path.join(path, "*.distcp"), e) from e


def _damaged(path: str, file: str, error: BaseException) -> ReplayError:
    failures = getattr(error, "failures", None)  # DCP's: {rank: (error, its traceback)}
    if failures:
        error = next(iter(failures.values()))[0]
    return ReplayError(
        f"checkpoint {path} cannot be read: {file}: {type(error).__name__}: {str(error).rstrip('.')}. It "
        "is damaged or incomplete (a save cut short?): move it aside, and the replay starts from the "
        "checkpoint before it (or the start)"
    )


def replay(setup: Setup, step: int, given_checkpoint: bool = False) -> tuple[list[Batch], object, str]:
    """Step ``step``'s batches (1-based, in delivery order), the pipeline, and where it began.
    ``given_checkpoint``: ``setup.checkpoints`` was named by the user (it must exist)."""
    from zephon.torchtitan.dataloader import ZephonDataLoader

    if step < 1:
        raise ValueError(f"--step {step}: steps count from 1")
    config = ZephonDataLoader.Config(
        recipe=setup.recipe, global_batch_size=setup.global_batch_size, skip_steps=list(setup.skip_steps),
        **setup.overrides,
    )  # fmt: skip
    loader = ZephonDataLoader(
        config, dp_world_size=1, dp_rank=0, seq_len=setup.seq_len, local_batch_size=setup.local_batch_size
    )
    pipeline = loader.pipeline
    per_lane = batches_per_lane(setup.global_batch_size, pipeline.opts.num_lanes, setup.local_batch_size)
    per_step = per_lane * pipeline.opts.num_lanes
    start, began = 0, "the start of the run"
    found = checkpoint_before(setup.checkpoints, step, given_checkpoint)
    skips = loader.skips
    if found is not None:
        start, path = found
        loader.load_state_dict(loader_state(path))
        began = f"checkpoint {path}"
    skip = (step - 1 - start) * per_step  # batches to make and drop: the steps between ...
    for r in _due(skips, start, step):  # ... and the data of skipped steps
        skips.apply(r)
        skip += (r[1] - r[0] + 1) * per_step
    data_step = step + skips.data_steps
    _check_within_data(pipeline, step, data_step, setup.global_batch_size)
    if data_step != step:
        began += f"; step {step} trains on the data of step {data_step} of a run without skips"
    what = f"step {step}" + (f" (data step {data_step})" if data_step != step else "")
    batches = _make(pipeline, skip, per_step, per_lane, what, data_step - step)
    pipeline.close()
    first = {b.index // per_lane for b in batches}
    if first != {data_step - 1}:  # a checkpoint from another schedule would shift the indices
        raise RuntimeError(
            f"replay reached the data of steps {sorted(s + 1 for s in first)}, not {data_step}"
        )
    return batches, pipeline, began


def _due(skips, start: int, step: int) -> list[tuple[int, int]]:
    """The skip ranges applied before training steps ``start + 1`` to ``step`` get their data."""
    return [r for r in skips.configured if start < r[0] <= step and skips.due(r[0]) == r]


def _make(pipeline, skip: int, per_step: int, per_lane: int, what: str, shift: int) -> list[Batch]:
    """Make and drop ``skip`` batches, logging progress; the next ``per_step`` batches. Lanes
    deliver in turn, each its next batch: a lane that misses its turn has ended. ``shift``: data
    steps skipped before the step."""
    lanes = pipeline.owned_lanes
    if skip:
        log.info("zephon: replay: %s: making the %d batches before it (%d per step)", what, skip, per_step)
    progress = Progress(f"replay: batches before {what}", skip, "batches")
    batches, it = [], iter(pipeline)
    for n, lane in zip(range(skip + per_step), itertools.cycle(lanes), strict=False):
        batch = next(it, None)
        if batch is None or batch.lane != lane:
            raise _data_ended(pipeline, lane, what, per_lane, shift)
        if n < skip:
            progress.update()
        else:
            batches.append(batch)
    return batches


def _data_ended(pipeline, lane: int, what: str, per_lane: int, shift: int) -> ReplayError:
    index = pipeline.state_dict()["lanes"][str(lane)]["index"]
    pipeline.close()
    held = index // per_lane
    last = f"replay step {held - shift} (data step {held})" if shift else f"replay step {held}"
    holds = f"holds {_count(held, 'step')}: {last} or earlier" if held > shift else "holds no whole step"
    return ReplayError(
        f"{what} lies past the data: lane {lane} ended after {_count(index, 'batch')} (its datasets "
        f'stop: exhausted = "stop"), so at this batch size the data {holds}'
    )


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "es" if noun.endswith("ch") else "s")


# Tokens a tokenizer makes of one byte of text, at most: a BPE or byte-level token covers at least
# a byte; normalizers can widen text (NFKC makes 18 characters of one 3-byte one, byte fallback up
# to 4 tokens of a character), 12 tokens a byte at worst. Each record adds at most 3 (BOS, EOS, a
# prefix space), and a line format has at most one record per byte.
TOKENS_PER_BYTE = 16 + 3


def data_bound(pipeline) -> tuple[int, int] | None:
    """(rows, bytes): at most how many rows all lanes together can make, where that follows from
    the bytes of the files: every dataset stops, is read as lines (JSON lines, text; decompressed
    bytes), and no ``map`` or image operator can make more text than a record holds. Else None."""
    from zephon.ops import Images, Map

    datasets, io = pipeline.source.datasets, pipeline.opts.io
    if any(d.exhausted != "stop" for d in datasets) or any(
        isinstance(op, Map | Images) for op in pipeline.operators
    ):
        return None
    if any(d.plain_format(io).unit != "bytes" for d in datasets):
        return None
    nbytes = sum(shard.size for d in datasets for shard in d.plain_shards(io))
    ops = pipeline.spec().lane_ops()
    rows = TOKENS_PER_BYTE * nbytes // ops.pack.row_len + pipeline.opts.num_lanes  # a last part row each
    if ops.pack.pads:
        rows += nbytes  # rows that may end in padding: at most one more row per document
    return rows, nbytes


def _check_within_data(pipeline, step: int, data_step: int, rows_per_step: int) -> None:
    """Refuse at once a step that no lane can reach, where the bytes of the data bound it."""
    bound = data_bound(pipeline)
    if bound is not None and data_step > bound[0] // rows_per_step:
        steps = bound[0] // rows_per_step
        raise ReplayError(
            f'step {step} lies past the data: the recipe\'s datasets stop (exhausted = "stop") and their '
            f"{bound[1]:,} bytes make at most {steps:,} steps of {rows_per_step} rows (at most "
            f"{TOKENS_PER_BYTE} tokens a byte): replay an earlier step"
        )


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
    parser = argparse.ArgumentParser(
        prog="python -m zephon.torchtitan.replay", description=__doc__.split("\n\n")[0]
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--job", help="a TorchTitan job config (train_configs/NAME.toml)")
    what.add_argument("--recipe", help="a data recipe (zephon_recipes/NAME.toml), with the batch geometry")
    parser.add_argument("--step", type=_step, required=True, help="the optimizer step, from 1")
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
    try:
        return _replay_and_print(parser, args, overrides)
    except ReplayError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 1


def _step(text: str) -> int:
    try:
        step = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step number") from None
    if step < 1:
        raise argparse.ArgumentTypeError(f"{step}: steps count from 1")
    return step


def _replay_and_print(parser, args, overrides) -> int:
    if args.checkpoint:  # before the minutes of planning
        try:
            checkpoint_before(args.checkpoint, args.step, given=True)
        except ReplayError as e:
            parser.error(str(e))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.job:
        setup = from_job(args.job, args.dump_folder, overrides)
    else:
        missing = [
            n for n in ("global_batch_size", "seq_len", "local_batch_size") if getattr(args, n) is None
        ]
        if missing:
            parser.error("--recipe needs " + ", ".join("--" + n.replace("_", "-") for n in missing))
        setup = Setup(args.recipe, {}, args.seq_len, args.local_batch_size, args.global_batch_size, None)
    if args.checkpoint:
        setup.checkpoints = args.checkpoint
    batches, pipeline, began = replay(setup, args.step, given_checkpoint=bool(args.checkpoint))
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
