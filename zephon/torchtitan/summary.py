"""What the data loader is about to do, said once as a job starts, and its progress to the first
batch: nothing is silent between the launch and step 1.

On global rank 0 (the one run_train.sh shows), e.g. for the debug job on 2 ranks::

    zephon: data recipe zephon_recipes/debug.toml: 1 dataset, weights by tokens
    zephon:   kjv 100.0% (repeat) /repo/assets/debug_corpus
    zephon:   tokenizer /repo/assets/tokenizers/kjv-bpe-2048: 2,048 tokens, EOS appended, no BOS
    zephon:   8 lanes, DP 2: this rank reads lanes 0-3; a step takes 1 batch of 2 rows from every
              lane (16 rows)
    zephon:   packing wrap, rows of 129 tokens; windows of 12 rows, shuffled (seed 7); runner
              thread, parallelism 1, prefetch 4
    zephon: planning the data: listing its files, reading their metadata (once per job)
    zephon: data planned in 0.4 s; preparing the first batches
    zephon: first batch delivered 0.6 s after the loader started (0.2 s after planning)

The last line comes when the trainer takes its first batch (after a restore, that includes the
replay of one window per lane).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)


class Startup:
    """``with Startup(...):`` around planning logs the summary and planning's time; then
    ``first_batch(stream)`` logs when the stream's first batch is delivered."""

    def __init__(self, recipe, pipeline, batches_per_lane: int, global_batch_size: int):
        self.loud = _global_rank() == 0
        self.start = self.planned = time.monotonic()
        if self.loud:
            for line in describe(recipe, pipeline, batches_per_lane, global_batch_size):
                log.info("zephon: %s", line)

    def __enter__(self) -> Startup:
        self.planning = time.monotonic()
        if self.loud:
            log.info("zephon: planning the data: listing its files, reading their metadata (once per job)")
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.planned = time.monotonic()
        if self.loud and kind is None:
            log.info(
                "zephon: data planned in %.1f s; preparing the first batches", self.planned - self.planning
            )

    def first_batch(self, stream: Iterator) -> Iterator:
        """``stream``, logging when its first item arrives."""
        for n, item in enumerate(stream):
            if n == 0 and self.loud:
                now = time.monotonic()
                log.info(
                    "zephon: first batch delivered %.1f s after the loader started (%.1f s after planning)",
                    now - self.start, now - self.planned,
                )  # fmt: skip
            yield item


def describe(recipe, pipeline, batches_per_lane: int, global_batch_size: int) -> list[str]:
    """The summary's lines: recipe, datasets and weights, tokenizer, lanes, packing, runner."""
    spec = pipeline.spec()
    opts, ops = spec.options, spec.lane_ops()
    source = spec.source
    schedule = recipe.mixture.schedule
    lines = [
        f"data recipe {recipe.path}: {_count(len(source.datasets), 'dataset')}, weights by {source.unit}"
        + (f", a schedule of {len(schedule)} points (the first below)" if schedule else "")
    ]
    for d, share in zip(source.datasets, source.shares, strict=True):  # a schedule's first point
        lines.append(f"  {d.name} {share:.1%} ({d.exhausted}) {d.path}")
    lines.append(f"  tokenizer {_tokenizer(pipeline)}")
    owned = opts.owned_lanes()
    lines.append(
        f"  {_count(opts.num_lanes, 'lane')}, DP {opts.dp_world_size}: this rank reads lanes "
        f"{owned[0]}-{owned[-1]}; a step takes {_count(batches_per_lane, 'batch')} of "
        f"{ops.batch.microbatch_size} rows from every lane ({global_batch_size} rows)"
    )
    shuffled = f"shuffled (seed {ops.shuffle.seed})" if ops.shuffle else "not shuffled"
    lines.append(
        f"  packing {ops.pack.algorithm}, rows of {ops.pack.row_len} tokens; windows of "
        f"{ops.window_rows} rows, {shuffled}; runner {opts.runner}, parallelism "
        f"{_parallelism(pipeline)}, prefetch {opts.prefetch}"
    )
    return lines


def _tokenizer(pipeline) -> str:
    from zephon.ops.tokenize import Tokenize

    op = next(op for op in pipeline.operators if isinstance(op, Tokenize))
    tok = op.tokenizer()
    specials = ("EOS appended" if op.add_eos else "no EOS") + (
        ", BOS prepended" if op.add_bos else ", no BOS"
    )
    return f"{op.tokenizer_id}: {tok.vocab_size:,} tokens, {specials}"


def _parallelism(pipeline) -> int:
    return max(op.parallelism for op in pipeline.operators if getattr(op, "stateless", False))


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "es" if noun.endswith("ch") else "s")


def _global_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
