"""The fluent pipeline builder: an immutable recipe.

A :class:`Pipeline` is a value: a work source, options and operators; every builder call returns
a new one. What a run holds (its plan, its lanes' states, background work) lives in a
:class:`zephon.run.Run`. For convenience a pipeline keeps one run of its own, so that
``for batch in pipeline``, ``pipeline.state_dict()`` and ``pipeline.load_state_dict()`` work on it
directly; a builder call on a pipeline whose run holds state carries the state over when only
performance settings change, and refuses otherwise, so that no state is silently lost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from zephon import fingerprint
from zephon.batch import Batch
from zephon.fields import check_table
from zephon.io import Dataset
from zephon.lanes import ChunkWork, LaneOps
from zephon.ops import BatchRows, Filter, Images, Map, Operator, PackFlat, Read, Shuffle, Tokenize
from zephon.options import PERFORMANCE, RENAMED, Options
from zephon.run import Run
from zephon.runners import thread_map
from zephon.work import DatasetWorkSource, LanePlan, PlanContext, StaticMixtureWorkSource

BEST_FIT_WINDOW_ROWS = 64  # best-fit packs a window at a time: enough rows to pack well


class Pipeline:
    """``Pipeline(source).options(...).tokenize(...).pack_flat(...).batch(...)``."""

    def __init__(self, source: StaticMixtureWorkSource | Dataset):
        if isinstance(source, Dataset):
            source = DatasetWorkSource(source)
        if not isinstance(source, StaticMixtureWorkSource):
            raise ValueError(f"Pipeline needs a work source or a Dataset, got {source!r}")
        self.source = source
        self._options = Options()
        self._ops: tuple[Operator, ...] = ()
        self._run: Run | None = None

    # -- building ---------------------------------------------------------------------------

    def _with(self, **changes) -> Pipeline:
        new = Pipeline.__new__(Pipeline)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        new._run = None
        if self._run is not None and self._run.holds_state:
            self._carry_to(new, changes)
        return new

    def _carry_to(self, new: Pipeline, changes: dict) -> None:
        """Hand this pipeline's run state to ``new`` if only performance settings differ."""
        changed = sorted(
            f.name
            for f in dataclasses.fields(Options)
            if getattr(self._options, f.name) != getattr(new._options, f.name)
        )
        shaping = [name for name in changed if name not in PERFORMANCE]
        if "_ops" in changes or shaping:
            what = f"options {shaping}" if shaping else "the operators"
            raise ValueError(
                f"this pipeline's run holds state (a loaded checkpoint, or batches delivered), and "
                f"changing {what} would start another recipe from it: build the pipeline in full "
                "first, then load_state_dict (or use pipeline.start() for a separate run); "
                f"{sorted(PERFORMANCE)} may change on a pipeline that holds state"
            )
        new._run = Run(new, lanes=self._run.lane_states())
        self._run.close()

    def options(self, **options) -> Pipeline:
        for name in options:
            if name in RENAMED:
                raise ValueError(f"option {RENAMED[name]}")
        check_table(options, Options, "options")
        return self._with(_options=dataclasses.replace(self._options, **options))

    def _then(self, op: Operator) -> Pipeline:
        given = self._output()
        if given == "batch":
            raise ValueError(f"{op.kind} comes after batch; batch must be the last operator")
        if given not in op.takes:
            hint = " (documents are mixed in order; shuffle the packed rows)" if op.kind == "shuffle" else ""
            raise ValueError(
                f"{op.kind} takes {'/'.join(op.takes)}, but the pipeline gives {given} here{hint}"
            )
        return self._with(_ops=(*self._ops, op))

    def _output(self) -> str:
        kind = "records"
        for op in self._ops:
            kind = op.output(kind)
        return kind

    def map(self, fn: Callable[[dict], dict], parallelism: int | None = None) -> Pipeline:
        return self._then(Map(fn, parallelism))

    def filter(self, fn: Callable[[dict], bool], parallelism: int | None = None) -> Pipeline:
        return self._then(Filter(fn, parallelism))

    def images(
        self, field: str = "image", size: int = 224, patch: int = 16, resize: str = "crop",
        mean: tuple[float, float, float] = (0.5, 0.5, 0.5), std: tuple[float, float, float] = (0.5, 0.5, 0.5),
        parallelism: int | None = None,
    ) -> Pipeline:  # fmt: skip
        """Decodes, resizes and cuts ``record[field]`` into patches (see ``zephon.ops.images``);
        then ``tokenize(image_token=...)`` gives one token per patch."""
        if any(isinstance(op, Images) for op in self._ops):
            raise ValueError("a pipeline takes one images() step (one patch size for all images)")
        return self._then(Images(field, size, patch, resize, mean, std, parallelism))

    def tokenize(
        self, tokenizer_id: str, field: str = "text", parallelism: int | None = None,
        add_bos: bool | None = None, add_eos: bool = True, backend: str = "auto",
        image_token: int | str | None = None,
    ) -> Pipeline:  # fmt: skip
        """Tokenizes ``record[field]``; after ``images()``, each image patch becomes one
        ``image_token`` (an id, or a token's name) before the text."""
        images = next((op for op in self._ops if isinstance(op, Images)), None)
        if images is not None and image_token is None:
            raise ValueError(
                f"the records carry images (images(field={images.field!r})): pass "
                "tokenize(image_token=...), the id or name of the token that stands for one patch"
            )
        image_field = images.field if images is not None else None
        return self._then(
            Tokenize(tokenizer_id, field, add_bos, add_eos, parallelism, backend, image_field, image_token)
        )

    def pack_flat(
        self,
        max_length: int,
        algorithm: str = "wrap",
        *,
        document_mask: bool = True,
        max_documents_per_row: int | None = None,
    ) -> Pipeline:
        """Packed rows (zephon.ops.pack): positions restart at each document unless
        ``document_mask=False``; ``max_documents_per_row`` bounds a row's documents."""
        return self._then(
            PackFlat(max_length, algorithm, self._pad_id(), document_mask, max_documents_per_row)
        )

    def shuffle(self, buffer_size: int, seed: int = 0) -> Pipeline:
        """Shuffles packed rows within each window (put it after ``pack_flat``)."""
        return self._then(Shuffle(buffer_size, seed))

    def batch(self, microbatch_size: int, *, balance_attention: bool = False) -> Pipeline:
        """Microbatches; ``balance_attention`` orders each window's rows so that their attention
        cost is even over time (zephon.ops.balance)."""
        return self._then(BatchRows(microbatch_size, self._pad_id(), balance_attention))

    def _pad_id(self) -> int:
        tok = next((op for op in self._ops if isinstance(op, Tokenize)), None)
        eos = tok.tokenizer().eos_id if tok else None
        return 0 if eos is None else eos

    # -- introspection ----------------------------------------------------------------------

    @property
    def opts(self) -> Options:
        return self._options

    @property
    def operators(self) -> tuple[Operator, ...]:
        return self._ops

    @property
    def dataset_names(self) -> list[str]:
        """Dataset names in index order: what ``Batch.sources`` values refer to."""
        return [d.name for d in self.source.datasets]

    @property
    def owned_lanes(self) -> list[int]:
        return self._options.owned_lanes()

    def fingerprint(self) -> dict:
        """Everything that shapes the data, readable, so that a mismatch can be named; what may
        change on restore is left out (see zephon.fingerprint, which makes it)."""
        return fingerprint.of_pipeline(self)

    # -- running: the pipeline's own run -------------------------------------------------------

    def start(self, state: dict | None = None) -> Run:
        """A new run of this recipe, separate from the pipeline's own, from ``state`` if given."""
        run = Run(self)
        if state is not None:
            run.load_state_dict(state)
        return run

    def _own_run(self) -> Run:
        if self._run is None:
            self._run = Run(self)
        return self._run

    def __iter__(self) -> Iterator[Batch]:
        """This rank's batches, from where the pipeline's run stands (see ``Run.__iter__``)."""
        return iter(self._own_run())

    def state_dict(self) -> dict:
        """The state of the pipeline's run: what has been delivered (see ``zephon.state``)."""
        return self._own_run().state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue the pipeline's run from ``state`` (see ``Run.load_state_dict``)."""
        self._own_run().load_state_dict(state)

    def stats(self) -> dict:
        """What the pipeline's run has delivered (see ``Run.stats``)."""
        return self._own_run().stats()

    def close(self) -> None:
        """Stops the background work of the pipeline's run; its state stays where delivery stopped."""
        if self._run is not None:
            self._run.close()

    # -- what a run needs of the recipe --------------------------------------------------------

    def window_rows(self) -> int:
        """Rows per window: ``window_rows`` if given, else the shuffle buffer rounded up to whole
        microbatches (one microbatch without a shuffle, 64 rows for best-fit packing)."""
        batch = next((op for op in self._ops if isinstance(op, BatchRows)), None)
        size = batch.microbatch_size if batch else 1
        given = self._options.window_rows
        if given is not None:
            if given % size:
                raise ValueError(
                    f"option window_rows={given} is not a whole number of microbatches of {size} rows: "
                    f"use a multiple of {size}, or leave it unset"
                )
            return given
        shuffle = next((op for op in self._ops if isinstance(op, Shuffle)), None)
        pack = next((op for op in self._ops if isinstance(op, PackFlat)), None)
        rows = shuffle.buffer_size if shuffle else 1
        if pack is not None and pack.algorithm == "best_fit":
            rows = max(rows, BEST_FIT_WINDOW_ROWS)
        return -(-max(rows, size) // size) * size

    def lane_ops(self) -> LaneOps:
        by_type = {type(op): op for op in self._ops}
        pack, batch = by_type[PackFlat], by_type[BatchRows]
        return LaneOps(pack, by_type.get(Shuffle), batch, self.window_rows(), by_type.get(Images))

    def chunk_work(self) -> tuple[ChunkWork, int]:
        """The stateless operators fused into one function per chunk, and its parallelism."""
        read = Read(self.source.datasets, self._options.io, self._options.read_parallelism)
        ops = [read, *(op for op in self._ops if op.stateless)]
        return ChunkWork(ops, self.source.names), max(op.parallelism for op in ops)

    def plan(self) -> LanePlan:
        """Which chunk of each dataset every lane reads: from metadata, once per run."""
        ctx = PlanContext(
            num_lanes=self._options.num_lanes,
            chunk_size=self._options.chunk_size,
            chunk_bytes=self._options.chunk_bytes,
            io=self._options.io,
            map_fn=thread_map,
        )
        plan = self.source.plan(ctx)
        self._check_image_field()
        self._check_text_field()
        return plan

    def _check_image_field(self) -> None:
        """``images(field=...)`` names a field that no dataset's schema has: a misspelling, named
        before any batch (datasets without a schema, JSON lines, are not checked)."""
        images = next((op for op in self._ops if isinstance(op, Images)), None)
        if images is None or any(isinstance(op, Map) for op in self._ops[: self._ops.index(images)]):
            return
        io = self._options.io
        names = {d.name: d.field_names(io) for d in self.source.datasets}
        if all(n is not None and images.field not in n for n in names.values()):
            raise ValueError(
                f"images(field={images.field!r}), but no dataset has such a field: their fields are "
                f"{names} (a folder of images with a metadata.jsonl needs format='imagefolder')"
            )

    def _check_text_field(self) -> None:
        """A Parquet or Arrow dataset without the column ``tokenize`` reads is named before any
        batch (unless a ``map`` before it may make the field)."""
        for op in self._ops:
            if isinstance(op, Map):
                return
            if isinstance(op, Tokenize):
                break
        else:
            return
        io = self._options.io
        for d in self.source.datasets:
            names = d.field_names(io)
            if names is not None and op.field not in names:
                raise ValueError(
                    f"dataset {d.name!r}: tokenize(field={op.field!r}), but {d.shards(io)[0].url} has no "
                    f"such column; its columns are {names}: pass field=, or map the records first"
                )
