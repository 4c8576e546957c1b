"""``python -m zephon.torchtitan.plan --job train_configs/NAME.toml [--steps N] [--section.field v ...]``

A dry run of a job's data, without training (``zephon plan ...`` once installed). It plans the
recipe (lists every dataset's files, reads their metadata, cuts the chunks) and prints per
dataset: its files, chunks and bytes; an estimate of its tokens, from a sample of its chunks read
and tokenized as the job would (``--sample``, spread evenly over the chunk table); how many epochs
of it ``N`` steps consume (``--steps``, default the job's ``training.steps``), from the mixture's
weights or schedule and the ``global_batch_size x (seq_len + 1)`` tokens of a step; where a
dataset that stops (``exhausted = "stop"``) runs out, as a step. Then the DP sizes the job can
start and resume on (the divisors of ``num_lanes``: the global batch splits across the lanes on
any of them) and what the first batch costs: the time to plan plus the time to the first batch
of rank 0 of ``--world-size`` processes (default 1), measured here with the recipe's runner.

Estimates: a dataset's tokens are its sample's tokens per unit of chunk (bytes of a line format,
rows of a row format) times its units, so they are as good as the sample is typical; a dataset
mixed by documents is converted with the sample's tokens per document. The lanes of a run end
together, within a few chunks of each other: the run-out step is where the mixture has consumed
the dataset's estimated tokens.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from zephon.torchtitan.checks import check_batch_geometry, check_context_length, divisors
from zephon.torchtitan.jobfile import batch_rows
from zephon.torchtitan.jobview import JobView, read
from zephon.torchtitan.recipe import build_pipeline, load_recipe
from zephon.work.schedule import Schedule

PROG = "python -m zephon.torchtitan.plan"


@dataclass
class DatasetEstimate:
    name: str
    exhausted: str
    files: int
    chunks: int
    bytes: int
    tokens: float  # estimated, the whole dataset
    documents: float
    sampled_chunks: int
    sampled_tokens: int


def estimate(pipeline, plan, sample: int) -> list[DatasetEstimate]:
    """Each dataset's size and estimated tokens, from ``sample`` of its chunks, evenly spread."""
    work, _ = pipeline.spec().chunk_work()
    work.prepare()
    out = []
    for i, (dataset, entry) in enumerate(zip(pipeline.source.datasets, plan.datasets, strict=True)):
        table = entry.chunks
        picks = np.unique(np.linspace(0, len(table) - 1, min(sample, len(table))).round().astype(int))
        tokens = documents = units = 0
        for j in picks:
            chunk = table.chunk(i, int(j))
            docs = work(chunk)
            tokens, documents = tokens + len(docs.tokens), documents + len(docs.records)
            units += chunk.size
        total = int((table.span_stop - table.span_start).sum())
        nbytes = int(entry.files.sizes.sum()) + (int(entry.images.sizes.sum()) if entry.images else 0)
        scale = total / units if units else 0.0
        out.append(DatasetEstimate(
            dataset.name, dataset.exhausted, len(entry.files) + len(entry.images or ()), len(table), nbytes,
            tokens * scale, documents * scale, len(picks), tokens,
        ))  # fmt: skip
    return out


def consumption(source, estimates: list[DatasetEstimate]):
    """``tokens -> [tokens of each dataset]``: what the run's mixture takes of each dataset in
    its first ``tokens`` tokens (by the weights, or the schedule, in the mixture's unit)."""
    names = source.names
    schedule = getattr(source, "schedule", None)
    if schedule is None:
        schedule = Schedule([{"at": 0, "weights": dict(zip(names, source.shares, strict=True))}], names)
    run = schedule.for_lane(1)  # the run's own schedule: every lane follows it scaled
    if source.unit == "tokens":
        return lambda tokens: [run.target(d, tokens) for d in range(len(names))]
    per_doc = [e.tokens / e.documents if e.documents else 0.0 for e in estimates]

    def by_documents(tokens: float) -> list[float]:
        low, high = 0.0, max(tokens, 1.0)  # a document has a token at least
        for _ in range(100):  # the documents that make ``tokens``: bisection, tokens grow with them
            mid = (low + high) / 2
            made = sum(run.target(d, mid) * per_doc[d] for d in range(len(names)))
            low, high = (mid, high) if made < tokens else (low, mid)
        return [run.target(d, high) * per_doc[d] for d in range(len(names))]

    return by_documents


def runs_out(taken, d: int, tokens: float, per_step: int) -> float:
    """The step at which the run has taken ``tokens`` of dataset ``d`` (inf: never)."""
    high = per_step
    while taken(high)[d] < tokens:
        high *= 2
        if high > 1e21:
            return math.inf  # its weight drops to 0 before it runs out
    low = 0
    while high - low > per_step:
        mid = (low + high) // 2
        low, high = (mid, high) if taken(mid)[d] < tokens else (low, mid)
    return high / per_step


def first_batch_cost(view: JobView, recipe, world_size: int) -> tuple[float, float, object, object]:
    """(seconds to plan, seconds from then to rank 0's first batch, the plan, the pipeline)."""
    pipeline = _pipeline(view, recipe, world_size)
    start = time.monotonic()
    plan = pipeline.plan()
    planned = time.monotonic()
    planned_pipeline = pipeline.with_plan(plan)
    next(iter(planned_pipeline))
    first = time.monotonic()
    planned_pipeline.close()
    return planned - start, first - planned, plan, planned_pipeline


def _pipeline(view: JobView, recipe, world_size: int):
    return build_pipeline(
        recipe, dp_rank=0, dp_world_size=world_size, seq_len=view.training.seq_len,
        microbatch_size=batch_rows(view.parallelism, view.training),
    )  # fmt: skip


def report(view: JobView, steps: int, sample: int, world_size: int) -> list[str]:
    """The dry run's lines (see the module docstring)."""
    recipe = load_recipe(view.recipe, view.overrides)
    check_context_length(recipe, view.training.seq_len)
    rows = batch_rows(view.parallelism, view.training)
    g = view.training.global_batch_size
    check_batch_geometry(num_lanes=recipe.num_lanes, dp_world_size=world_size, local_batch_size=rows,
                         global_batch_size=g)  # fmt: skip
    plan_s, first_s, plan, pipeline = first_batch_cost(view, recipe, world_size)
    estimates = estimate(pipeline, plan, sample)
    per_step = g * (view.training.seq_len + 1)
    taken = consumption(pipeline.source, estimates)(steps * per_step)
    end = {e.name: runs_out(consumption(pipeline.source, estimates), d, e.tokens, per_step)
           for d, e in enumerate(estimates) if e.exhausted == "stop"}  # fmt: skip
    lines = [
        f"job {view.path}: recipe {view.recipe}, {recipe.num_lanes} lanes; a step is {g} rows of "
        f"{view.training.seq_len + 1} tokens = {per_step:,} tokens; {steps:,} steps = "
        f"{steps * per_step:,} tokens",
    ]
    header = ["dataset", "files", "chunks", "bytes", "tokens (est.)", "share", f"tokens in {steps:,} steps",
              "epochs", "runs out"]  # fmt: skip
    rows = []
    for e, t in zip(estimates, taken, strict=True):
        epochs = t / e.tokens if e.tokens else math.inf
        rows.append([
            e.name, f"{e.files:,}", f"{e.chunks:,}", _bytes(e.bytes), f"{e.tokens:,.0f}",
            f"{t / max(sum(taken), 1):.1%}", f"{t:,.0f}", _epochs(epochs),
            "never (repeats)" if e.exhausted != "stop" else _step(end[e.name]),
        ])  # fmt: skip
    lines += ["", *_table(header, rows)]
    sampled = ", ".join(f"{e.sampled_chunks:,} of {e.chunks:,} chunks" for e in estimates)
    lines.append(f"(tokens estimated from {sampled} read and tokenized)")
    if end and min(end.values()) < steps:
        first = min(end, key=end.get)
        lines.append(f"the data ends before step {steps:,}: {first!r} runs out {_step(end[first])}")
    lines += [
        "",
        f"DP sizes it can start and resume on: {', '.join(map(str, divisors(recipe.num_lanes, 10**9)))} "
        f"(the divisors of num_lanes {recipe.num_lanes}; GPUs = DP x TP x PP x CP)",
        f"first batch: planning {plan_s:.1f} s ({plan.summary()}), then {first_s:.1f} s to the first batch "
        f"of rank 0 of {world_size} (runner {pipeline.opts.runner}): {plan_s + first_s:.1f} s",
    ]
    return lines


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns as wide as their widest cell: the first and last left-aligned, numbers right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    last = len(header) - 1
    return [
        "  ".join(c.ljust(w) if i in (0, last) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths,
                  strict=True))).rstrip() for r in [header, *rows]
    ]  # fmt: skip


def _epochs(epochs: float) -> str:
    return f"{epochs:,.0f}" if epochs >= 1000 else f"{epochs:.3f}"


def _step(step: float) -> str:
    return "never (weight 0)" if math.isinf(step) else f"in step {math.ceil(step):,}"


def _bytes(n: int) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[1], allow_abbrev=False)
    parser.add_argument("--job", required=True, help="the job config (train_configs/NAME.toml)")
    parser.add_argument("--steps", type=int, help="steps to account for (default: training.steps)")
    parser.add_argument("--sample", type=int, default=8, help="chunks per dataset to tokenize (default 8)")
    parser.add_argument("--world-size", type=int, default=1, help="processes of the job, for the first batch")
    args, overrides = parser.parse_known_args(argv)
    for name in ("steps", "sample", "world_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        view = read(args.job, overrides)
        if view.loader != "zephon":
            raise ValueError(f"{args.job}: [data] loader = {view.loader!r}: a dry run plans zephon's recipes")
        lines = report(view, args.steps or view.training.steps, args.sample, args.world_size)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
