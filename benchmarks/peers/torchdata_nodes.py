"""torchdata 0.11 ``torchdata.nodes``, composed the way its guides compose a pipeline.

The graph, source to root::

    IterableWrapper(JsonLines)  one per dataset: raw lines of the JSON lines file, resumable
                                (byte offset as its state)
    MultiNodeWeightedSampler    draws the next record's dataset by ``setup.weights``, CYCLE_FOREVER
                                (an exhausted dataset is reset and read again: every dataset
                                repeats), seeded by ``setup.seed``, rank 0 of 1
    ParallelMapper(Tokenize)    ``json.loads`` + Hugging Face ``tokenizers`` (no special tokens)
                                + the id of ``<|endoftext|>``; ``setup.workers`` workers,
                                ``method=setup.method``, in order
    Packer                      written here (nodes has no packer): concatenates documents and
                                cuts rows of exactly ``seq_len + 1`` tokens, carrying the rest
                                of a document into the next row; its state holds that remainder
    Batcher                     ``setup.microbatch`` rows, drop_last
    Mapper(collate)             rows -> :class:`Out` (stacked int32 tokens, valid all True)
    Prefetcher                  a background thread, 2 batches ahead
    Loader                      the resumable iterable (``state_dict`` / ``load_state_dict``)

Mixture: ``MultiNodeWeightedSampler`` mixes by records (documents), not tokens; nodes has no
notion of a token ratio, so a dataset of long documents gets a larger share of tokens than its
weight. Shuffle: ``torchdata.nodes`` 0.11 has no shuffle-buffer node, so ``setup.shuffle`` is not
used: documents are read in file order (the sampler only interleaves the datasets). No
``PinMemory`` (it is for a GPU). No padding: every row is full, so ``valid`` is all True.

``setup.options``: ``prefetch`` (batches, default 2), ``mp_context`` (for ``method="process"``;
default: the platform's, fork on Linux).
"""

from __future__ import annotations

import json
import pickle
from collections import deque
from typing import Any

import numpy as np
from torchdata.nodes import (
    BaseNode,
    Batcher,
    IterableWrapper,
    Loader,
    Mapper,
    MultiNodeWeightedSampler,
    ParallelMapper,
    Prefetcher,
    StopCriteria,
)

from benchmarks.peers.common import Out, Setup

EOS = "<|endoftext|>"


class JsonLines:
    """An iterable over the non-blank lines (bytes) of a JSON lines file; stateful for nodes'
    ``IterableWrapper``: its state is the byte offset of the next line, so a resume seeks there
    instead of reading the file again from its start."""

    def __init__(self, path: str):
        self.path = path
        self._offset = 0  # of the next line the live iterator yields
        self._resume = 0  # where the next iter() starts

    def __iter__(self):
        start, self._resume = self._resume, 0
        self._offset = start
        return self._lines(start)

    def _lines(self, start: int):
        with open(self.path, "rb") as f:
            f.seek(start)
            for line in f:
                self._offset += len(line)
                if line.strip():
                    yield line

    def state_dict(self) -> dict[str, Any]:
        return {"offset": self._offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = self._offset = int(state["offset"])


class Tokenize:
    """A JSON line -> int32 token ids of its ``text``, EOS appended. Picklable (for process
    workers): the tokenizer is loaded where it is first used."""

    def __init__(self, tokenizer_json: str):
        self.tokenizer_json = tokenizer_json
        self._tokenizer = None
        self._eos = -1

    def _load(self):
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(self.tokenizer_json)
        eos = tokenizer.token_to_id(EOS)
        if eos is None:
            raise ValueError(f"{self.tokenizer_json} has no {EOS} token")
        self._eos = eos
        self._tokenizer = tokenizer
        return tokenizer

    def __getstate__(self):
        return {"tokenizer_json": self.tokenizer_json, "_tokenizer": None, "_eos": -1}

    def __call__(self, line: bytes) -> np.ndarray:
        tokenizer = self._tokenizer or self._load()
        ids = tokenizer.encode(json.loads(line)["text"], add_special_tokens=False).ids
        out = np.empty(len(ids) + 1, dtype=np.int32)
        out[:-1] = ids
        out[-1] = self._eos
        return out


class Packer(BaseNode[np.ndarray]):
    """Documents (int arrays) in, rows of exactly ``row_len`` tokens out: the documents are
    concatenated and cut; what is left of a document after a cut starts the next row. Its
    state is the source's state plus the tokens carried over (a list of ints)."""

    SOURCE_KEY = "source"
    CARRY_KEY = "carry"

    def __init__(self, source: BaseNode[np.ndarray], row_len: int):
        super().__init__()
        if row_len < 1:
            raise ValueError(f"row_len must be positive, got {row_len}")
        self.source = source
        self.row_len = row_len
        self._chunks: deque[np.ndarray] = deque()
        self._head = 0  # tokens of _chunks[0] already used

    def reset(self, initial_state: dict[str, Any] | None = None):
        super().reset(initial_state)
        self._chunks.clear()
        self._head = 0
        if initial_state is None:
            self.source.reset()
            return
        self.source.reset(initial_state[self.SOURCE_KEY])
        carry = initial_state[self.CARRY_KEY]
        if carry:
            self._chunks.append(np.asarray(carry, dtype=np.int32))

    def next(self) -> np.ndarray:
        parts, need = [], self.row_len
        while need:
            if not self._chunks:
                doc = next(self.source)  # StopIteration ends the stream; the carry is dropped
                if len(doc):
                    self._chunks.append(doc)
                continue
            head = self._chunks[0]
            take = min(len(head) - self._head, need)
            parts.append(head[self._head : self._head + take])
            self._head += take
            need -= take
            if self._head == len(head):
                self._chunks.popleft()
                self._head = 0
        return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)

    def get_state(self) -> dict[str, Any]:
        carry: list[int] = []
        for i, chunk in enumerate(self._chunks):
            carry.extend((chunk[self._head :] if i == 0 else chunk).tolist())
        return {self.SOURCE_KEY: self.source.state_dict(), self.CARRY_KEY: carry}


def collate(rows: list[np.ndarray]) -> Out:
    tokens = np.stack(rows)
    return Out(tokens, np.ones(tokens.shape, dtype=bool))


def build(setup: Setup) -> Loader:
    """The pipeline, as a ``Loader`` (not started: iterate it)."""
    if setup.method not in ("thread", "process"):
        raise ValueError(f"torchdata.nodes workers are threads or processes, not {setup.method!r}")
    names = list(setup.files)
    sources = {name: IterableWrapper(JsonLines(setup.files[name])) for name in names}
    node: BaseNode = MultiNodeWeightedSampler(
        sources,
        {name: float(setup.weights[name]) for name in names},
        stop_criteria=StopCriteria.CYCLE_FOREVER,
        rank=0,
        world_size=1,
        seed=setup.seed,
    )
    node = ParallelMapper(
        node,
        map_fn=Tokenize(setup.tokenizer_json),
        num_workers=setup.workers,
        method=setup.method,
        multiprocessing_context=setup.options.get("mp_context"),
        in_order=True,
    )
    node = Packer(node, setup.seq_len + 1)
    node = Batcher(node, batch_size=setup.microbatch, drop_last=True)
    node = Mapper(node, collate)
    node = Prefetcher(node, prefetch_factor=int(setup.options.get("prefetch", 2)))
    return Loader(node)


def batches(setup: Setup):
    loader = build(setup)
    it = iter(loader)
    try:
        yield from it
    finally:
        _shut_down(loader.root)


def state_bytes(what, batches_taken: int = 40) -> int:
    """Bytes of a pickled ``state_dict()`` (nodes' state holds a torch generator state, so it is
    not JSON). ``what``: a :class:`Loader` or a node (measured as it stands), or a
    :class:`Setup` (a pipeline is built, ``batches_taken`` batches taken, then measured)."""
    if isinstance(what, Setup):
        loader = build(what)
        it = iter(loader)
        for _ in range(batches_taken):
            next(it)
        try:
            return len(pickle.dumps(loader.state_dict()))
        finally:
            _shut_down(loader.root)
    return len(pickle.dumps(what.state_dict()))


def _shut_down(node: BaseNode) -> None:
    """Stop the prefetch thread and the mapper's threads or processes now, rather than when
    they are collected (nodes has no public close; its iterators have ``_shutdown``)."""
    pending = [node]
    while pending:
        n = pending.pop()
        it = getattr(n, "_it", None)
        for inner in (it, getattr(it, "_it", None)):
            if hasattr(inner, "_shutdown"):
                inner._shutdown()
        source = getattr(n, "source", None)
        if isinstance(source, BaseNode):
            pending.append(source)
