"""The fluent pipeline builder: an immutable recipe.

A :class:`Pipeline` is a value: a work source, options and operators; every builder call returns
a new one. What a run needs of it is a :class:`zephon.spec.RunSpec` (``spec()``); what a run holds
(its plan, its lanes' states, background work) lives in a :class:`zephon.run.Run`. For
convenience a pipeline keeps one run of its own, so that ``for batch in pipeline``,
``pipeline.state_dict()`` and ``pipeline.load_state_dict()`` work on it directly; a builder call
on a pipeline whose run holds state carries the state over when only performance settings
change, and refuses otherwise, so that no state is silently lost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from zephon.batch import Batch
from zephon.fingerprint import PERFORMANCE_OPTIONS
from zephon.io import Dataset
from zephon.jobplan import JobPlan
from zephon.ops import BatchRows, Filter, Images, Map, Operator, PackFlat, Shuffle, Tokenize
from zephon.ops.decoders import DEFAULT as DEFAULT_DECODER
from zephon.options import Options
from zephon.run import Run
from zephon.runners import get_runner
from zephon.spec import RunSpec, output_of
from zephon.work import DatasetWorkSource, MixtureWorkSource


class Pipeline:
    """``Pipeline(source).options(...).tokenize(...).pack_flat(...).batch(...)``."""

    def __init__(self, source: MixtureWorkSource | Dataset):
        if isinstance(source, Dataset):
            source = DatasetWorkSource(source)
        if not isinstance(source, MixtureWorkSource):
            raise ValueError(f"Pipeline needs a work source or a Dataset, got {source!r}")
        self.source = source
        self._options = Options()
        self._ops: tuple[Operator, ...] = ()
        self._plan: JobPlan | None = None
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
        shaping = [name for name in changed if name not in PERFORMANCE_OPTIONS]
        if "_ops" in changes or shaping:
            what = f"options {shaping}" if shaping else "the operators"
            raise ValueError(
                f"this pipeline's run holds state (a loaded checkpoint, or batches delivered), and "
                f"changing {what} would start another recipe from it: build the pipeline in full "
                "first, then load_state_dict (or use pipeline.start() for a separate run); "
                f"{sorted(PERFORMANCE_OPTIONS)} may change on a pipeline that holds state"
            )
        new._run = Run(new.spec(), lanes=self._run.lane_states())
        self._run.close()

    def options(self, **options) -> Pipeline:
        return self._with(_options=self._options.replace(**options))

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
        return output_of(self._ops)

    def map(self, fn: Callable[[dict], dict], parallelism: int | None = None) -> Pipeline:
        return self._then(Map(fn, parallelism))

    def filter(self, fn: Callable[[dict], bool], parallelism: int | None = None) -> Pipeline:
        return self._then(Filter(fn, parallelism))

    def images(
        self, field: str = "image", size: int = 224, patch: int = 16, resize: str = "crop",
        mean: tuple[float, float, float] = (0.5, 0.5, 0.5), std: tuple[float, float, float] = (0.5, 0.5, 0.5),
        parallelism: int | None = None, decoder: str = DEFAULT_DECODER, resizer: str = "pillow",
    ) -> Pipeline:  # fmt: skip
        """Decodes, resizes and cuts ``record[field]`` into patches (see ``zephon.ops.images``);
        then ``tokenize(image_token=...)`` gives one token per patch. ``decoder``: the library that
        decodes (``zephon.ops.decoders``), ``resizer``: what resizes (``"pillow"`` or ``"torch"``)."""
        if any(isinstance(op, Images) for op in self._ops):
            raise ValueError("a pipeline takes one images() step (one patch size for all images)")
        return self._then(Images(field, size, patch, resize, mean, std, parallelism, decoder, resizer))

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
        return self.spec().fingerprint()

    def spec(self) -> RunSpec:
        """What a run of this recipe needs of it (see zephon.spec)."""
        return RunSpec(self.source, self._options, self._ops, self._plan)

    def plan(self) -> JobPlan:
        """The job plan: every dataset listed and planned into chunks (the given plan, if any;
        see zephon.jobplan). Save it, share it, and give it to the job's other pipelines."""
        return self.spec().plan()

    def with_plan(self, plan: JobPlan) -> Pipeline:
        """This pipeline with a job plan made for its recipe (refused by name otherwise, when the
        run starts): it lists nothing and reads no metadata. It changes no data, so a pipeline
        that holds state keeps it."""
        if not isinstance(plan, JobPlan):
            raise ValueError(f"with_plan takes a JobPlan (pipeline.plan(), JobPlan.load(path)), got {plan!r}")
        return self._with(_plan=plan)

    def warm_up(self) -> Pipeline:
        """Start now what this rank's workers start from, where the runner has such a thing, so
        that the first iteration's workers are up at once: with ``runner="process"``, the fork
        server, which imports the work's modules and loads its tokenizers meanwhile (1-3 s on a
        busy machine; a pool started without it runs its units on one thread of this process
        until then). Call it where the loader is built well before it is iterated (a trainer
        builds its model and loads its checkpoint in between; zephon's TorchTitan loader does).
        It changes no data and starts no worker; with the other runners it does nothing. Returns
        the pipeline."""
        work, parallelism = self.spec().chunk_work()
        if parallelism:
            get_runner(self._options.runner).warm_up(work)
        return self

    # -- running: the pipeline's own run -------------------------------------------------------

    def start(self, state: dict | None = None) -> Run:
        """A new run of this recipe, separate from the pipeline's own, from ``state`` if given."""
        run = Run(self.spec())
        if state is not None:
            run.load_state_dict(state)
        return run

    def _own_run(self) -> Run:
        if self._run is None:
            self._run = Run(self.spec())
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
