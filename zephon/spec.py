"""What a run needs of a recipe: its source, options and operators, and what follows from them.

A :class:`zephon.Pipeline` builds a :class:`RunSpec` (``pipeline.spec()``); a
:class:`zephon.run.Run` takes one and nothing else of the pipeline. The spec is a value: it
makes the plan (I/O, once per run), the lane's steps, the workers' fused function and the
fingerprint, each on demand.
"""

from __future__ import annotations

from dataclasses import dataclass

from zephon import fingerprint
from zephon.jobplan import JobPlan, make_plan
from zephon.lanes import ChunkWork, LaneOps
from zephon.ops import BatchRows, Images, Map, Operator, PackFlat, Read, Shuffle, Tokenize
from zephon.options import Options
from zephon.runners import planning_map
from zephon.work import LanePlan, MixtureWorkSource

BEST_FIT_WINDOW_ROWS = 64  # best-fit packs a window at a time: enough rows to pack well


def output_of(operators: tuple[Operator, ...]) -> str:
    """What a pipeline of ``operators`` gives: records, documents, rows or batches."""
    kind = "records"
    for op in operators:
        kind = op.output(kind)
    return kind


@dataclass(frozen=True)
class RunSpec:
    source: MixtureWorkSource
    options: Options
    operators: tuple[Operator, ...]
    job_plan: JobPlan | None = None  # given (pipeline.with_plan): no listing or metadata request

    @property
    def output(self) -> str:
        return output_of(self.operators)

    @property
    def owned_lanes(self) -> list[int]:
        return self.options.owned_lanes()

    def _op(self, kind: type) -> Operator | None:
        return next((op for op in self.operators if isinstance(op, kind)), None)

    def fingerprint(self) -> dict:
        """Everything that shapes the data (see zephon.fingerprint, which makes it)."""
        if self.job_plan is not None:
            self.plan()  # the files' versions come from the plan, not from listing them again
        return fingerprint.of_spec(self)

    def window_rows(self) -> int:
        """Rows per window: ``window_rows`` if given, else the shuffle buffer rounded up to whole
        microbatches (one microbatch without a shuffle, 64 rows for best-fit packing)."""
        batch = self._op(BatchRows)
        size = batch.microbatch_size if batch else 1
        given = self.options.window_rows
        if given is not None:
            if given % size:
                raise ValueError(
                    f"option window_rows={given} is not a whole number of microbatches of {size} rows: "
                    f"use a multiple of {size}, or leave it unset"
                )
            return given
        shuffle, pack = self._op(Shuffle), self._op(PackFlat)
        rows = shuffle.buffer_size if shuffle else 1
        if pack is not None and pack.algorithm == "best_fit":
            rows = max(rows, BEST_FIT_WINDOW_ROWS)
        return -(-max(rows, size) // size) * size

    def lane_ops(self) -> LaneOps:
        """What a lane does with its documents (a pipeline that ends with ``batch``)."""
        return LaneOps(
            self._op(PackFlat), self._op(Shuffle), self._op(BatchRows), self.window_rows(), self._op(Images)
        )

    def chunk_work(self) -> tuple[ChunkWork, int]:
        """The stateless operators fused into one function per chunk, and its parallelism."""
        read = Read(self.source.datasets, self.options.io, self.options.read_parallelism)
        ops = [read, *(op for op in self.operators if op.stateless)]
        return ChunkWork(ops, self.source.names), max(op.parallelism for op in ops)

    def plan(self) -> JobPlan:
        """The job plan (zephon.jobplan): the given one, checked against the recipe, else made now
        (the store's listing and metadata requests); the datasets take it either way."""
        options, datasets = self.options, self.source.datasets
        chunking = options.num_lanes, options.chunk_size, options.chunk_bytes
        if self.job_plan is None:
            plan = make_plan(datasets, *chunking, options.io, planning_map(options.io))
        else:
            plan = self.job_plan
            plan.check(self.plan_identity())
        for dataset, entry in zip(datasets, plan.datasets, strict=True):
            dataset.adopt(entry, *chunking)
        self._check_image_field()
        self._check_text_field()
        return plan

    def plan_identity(self) -> dict:
        """What of this recipe its job plan depends on (see ``JobPlan.identity``)."""
        options = self.options
        return JobPlan.identity(
            self.source.datasets, options.num_lanes, options.chunk_size, options.chunk_bytes
        )

    def lane_plan(self) -> LanePlan:
        """Which chunk of each dataset every lane reads: from the job plan, once per run."""
        tables = [entry.chunks for entry in self.plan().datasets]
        given = self.options.chunk_size is not None or self.options.chunk_bytes is not None
        return self.source.lane_plan(tables, self.options.num_lanes, given)

    def _check_image_field(self) -> None:
        """``images(field=...)`` names a field that no dataset's schema has: a misspelling, named
        before any batch (datasets without a schema, JSON lines, are not checked)."""
        images = self._op(Images)
        if images is None or any(
            isinstance(op, Map) for op in self.operators[: self.operators.index(images)]
        ):
            return
        io = self.options.io
        names = {d.name: d.field_names(io) for d in self.source.datasets}
        if all(n is not None and images.field not in n for n in names.values()):
            raise ValueError(
                f"images(field={images.field!r}), but no dataset has such a field: their fields are "
                f"{names} (a folder of images with a metadata.jsonl needs format='imagefolder')"
            )

    def _check_text_field(self) -> None:
        """A Parquet or Arrow dataset without the column ``tokenize`` reads is named before any
        batch (unless a ``map`` before it may make the field)."""
        for op in self.operators:
            if isinstance(op, Map):
                return
            if isinstance(op, Tokenize):
                break
        else:
            return
        io = self.options.io
        for d in self.source.datasets:
            names = d.field_names(io)
            if names is not None and op.field not in names:
                raise ValueError(
                    f"dataset {d.name!r}: tokenize(field={op.field!r}), but {d.shards(io)[0].url} has no "
                    f"such column; its columns are {names}: pass field=, or map the records first"
                )
