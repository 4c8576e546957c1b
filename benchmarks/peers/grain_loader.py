"""Grain 0.2 (``import grain``), built the way its ``Dataset`` documentation builds a text pipeline.

Both layouts start from the same stateless ``grain.MapDataset`` of documents:

* one ``MapDataset.source`` per JSON lines file (``JsonLines``: a random-access source over the
  file's line offsets), globally shuffled with ``.shuffle(seed)`` and repeated forever with
  ``.repeat()`` (a new order each epoch). Each source is shuffled *before* mixing, as Grain's
  docs advise, so the mixture keeps its proportions;
* ``MapDataset.mix(datasets, weights)``. Grain mixes by **records** (documents), not by tokens:
  ``setup.weights`` are shares of *documents* drawn from each dataset, so a dataset of long
  documents gets a larger share of the tokens than its weight;
* ``.map(Tokenize)``: parse the JSON line, encode ``"text"`` with ``tokenizers.Tokenizer`` (no
  special tokens), append the id of ``<|endoftext|>``.

Grain's shuffle is a global index shuffle (a permutation of each epoch), so ``setup.shuffle`` (a
buffer size) has no counterpart and is not used; neither is ``setup.lanes``.

Packing is ``grain.experimental.ConcatThenSplitIterDataset``: concatenate the stream of documents
and cut it into rows of ``seq_len + 1`` tokens (a document may run on into the next row). It pads
only the last row of a finite stream, so on these endless streams there is no padding at all;
``valid`` comes from its ``tokens_segment_ids`` (0 on padding) all the same. Then
``IterDataset.batch(microbatch, drop_remainder=True)``.

Workers are ``setup.workers`` *processes* (``IterDataset.mp_prefetch``); ``setup.method ==
"inline"`` runs everything in the calling process. Processes, because ``Tokenizer.encode`` holds
the GIL: threads do not tokenize in parallel (``setup.options["prefetch"] = "thread"`` runs the
same layout on Grain's threads, ``grain.experimental.multithread_prefetch``, for comparison).

* ``batches_fastest``, the "fastest layout": the whole pipeline, packing and batching included,
  runs inside each worker process, ``mp_prefetch`` last. Only finished batches cross processes;
  the main process hands the workers' batches out in turn. Worker ``i`` reads the ``i``-th
  contiguous share of every file (``sequential_slice=True``) and shuffles, mixes and packs just
  that, so which documents share a row, and which rows share a batch, *depend on the number of
  workers* (Grain's ``mp_prefetch`` docstring says so of packing and other stateful steps).
* ``batches_invariant``, the "worker-invariant layout": only the stateless steps (read, parse,
  tokenize) run in the workers. ``mp_prefetch`` slices the document sequence ``i::workers`` and
  interleaves the workers' outputs in turn, which gives back the documents in their original
  order; packing and batching run after it, once, in the main process, so the output is the same
  for any number of workers (0 included). To cut the per-element cost of crossing processes the
  workers tokenize groups of ``setup.options.get("group", 16)`` consecutive documents
  (``MapDataset.batch`` into a list), which the main process flattens again with
  ``grain.experimental.FlatMapIterDataset`` before packing; the order of documents is unchanged.

``state_bytes(iterator)``: bytes of the JSON of a Grain ``DatasetIterator.get_state()``, for an
iterator of ``fastest_dataset(setup)`` or ``invariant_dataset(setup)`` (a few hundred bytes: read
positions and the packer's remainder, no data).

Image-text documents (``setup.image_size``, ``benchmarks/vlm.py``): a random-access source over
the Parquet rows (``ParquetRows``), globally shuffled and repeated, ``.map(EncodeImageText)``
(decode, patches with ``zephon.ops.images.Images``, tokenize), packed with the patches as a
feature aligned with the tokens (zeros under text tokens: Grain packs features of one length).
The same two layouts; vlm.py reads one thread deep (``options`` ``read_threads=1``,
``read_buffer=4``) and groups nothing (``group=1``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import grain
import numpy as np

from benchmarks.peers.common import Out, Setup

EOS = "<|endoftext|>"


class JsonLines(grain.sources.RandomAccessDataSource):
    """The non-blank lines of a JSON lines file, by index (a Grain random-access data source).

    Holds the line offsets only; reads a line with ``os.pread`` (safe from several threads).
    Picklable: ``mp_prefetch`` ships the pipeline to its worker processes, which reopen the file."""

    def __init__(self, path: str, chunk: int = 1 << 24):
        self.path = path
        starts, ends = [], []
        with open(path, "rb") as f:
            offset, line_start = 0, 0
            while data := f.read(chunk):
                newlines = np.flatnonzero(np.frombuffer(data, np.uint8) == ord("\n")) + offset
                if len(newlines):
                    starts.append(np.concatenate(([line_start], newlines[:-1] + 1)))
                    ends.append(newlines)
                    line_start = int(newlines[-1]) + 1
                offset += len(data)
            if offset > line_start:  # a last line without a newline
                starts.append([line_start])
                ends.append([offset])
            starts = np.concatenate(starts).astype(np.int64) if starts else np.zeros(0, np.int64)
            ends = np.concatenate(ends).astype(np.int64) if ends else np.zeros(0, np.int64)
            keep = ends > starts
            for i in np.flatnonzero(keep & (ends - starts < 16)):  # short lines: blank?
                f.seek(starts[i])
                keep[i] = bool(f.read(int(ends[i] - starts[i])).strip())
        self._starts, self._ends = starts[keep], ends[keep]
        if not len(self._starts):
            raise ValueError(f"{path} has no records")
        self._fd = None

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, index: int) -> bytes:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        start = int(self._starts[index])
        return os.pread(self._fd, int(self._ends[index]) - start, start)

    def __getstate__(self):
        return {**self.__dict__, "_fd": None}

    def __repr__(self) -> str:
        return f"JsonLines({self.path!r}, records={len(self)})"


class Tokenize(grain.transforms.Map):
    """A JSON line -> ``{"tokens": int32 [n + 1]}``: the ids of its ``"text"``, then EOS.

    The tokenizer is loaded in whichever process runs the map, on first use, and never pickled."""

    def __init__(self, tokenizer_json: str):
        self.tokenizer_json = tokenizer_json
        self._loaded = None  # (tokenizer, eos id), set at once: thread-safe

    def _load(self):
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(self.tokenizer_json)
        eos = tokenizer.token_to_id(EOS)
        if eos is None:
            raise ValueError(f"{self.tokenizer_json} has no {EOS} token")
        self._loaded = (tokenizer, eos)
        return self._loaded

    def map(self, element: bytes) -> dict[str, np.ndarray]:
        tokenizer, eos = self._loaded or self._load()
        ids = tokenizer.encode(json.loads(element)["text"], add_special_tokens=False).ids
        ids.append(eos)
        return {"tokens": np.array(ids, dtype=np.int32)}

    def __getstate__(self):
        return {"tokenizer_json": self.tokenizer_json, "_loaded": None}


class ParquetRows(grain.sources.RandomAccessDataSource):
    """The rows of a Parquet file of images and captions, ``{"image": bytes, "text": str}``, by
    index (the table is read once per process, on first use)."""

    def __init__(self, path: str):
        import pyarrow.parquet as pq

        self.path, self.n, self._table = path, pq.ParquetFile(path).metadata.num_rows, None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        if self._table is None:
            import pyarrow.parquet as pq

            self._table = pq.read_table(self.path)
        table = self._table
        return {"image": table["image"][index].as_py()["bytes"], "text": table["text"][index].as_py()}

    def __getstate__(self):
        return {"path": self.path, "n": self.n, "_table": None}


class EncodeImageText(grain.transforms.Map):
    """A row -> ``{"tokens": one image token per patch, the caption's ids, EOS; "pixels": the
    patches under the image tokens, zeros under the text}``. Loaded on first use, never pickled."""

    def __init__(self, setup: Setup):
        self.setup, self._loaded = setup, None

    def _load(self):
        from tokenizers import Tokenizer

        from zephon.ops.images import Images

        tokenizer = Tokenizer.from_file(self.setup.tokenizer_json)
        # decoding with Pillow, as Grain's users do
        images = Images(size=self.setup.image_size, patch=self.setup.patch, decoder="pillow")
        self._loaded = (tokenizer, tokenizer.token_to_id(EOS), images)
        return self._loaded

    def map(self, row: dict) -> dict[str, np.ndarray]:
        tokenizer, eos, images = self._loaded or self._load()
        patches = images.patches(row["image"]).pixels
        text = tokenizer.encode(row["text"], add_special_tokens=False).ids
        tokens = np.array([self.setup.image_token] * len(patches) + text + [eos], np.int32)
        pixels = np.zeros((len(tokens), patches.shape[1]), np.uint8)
        pixels[: len(patches)] = patches
        return {"tokens": tokens, "pixels": pixels}

    def __getstate__(self):
        return {"setup": self.setup, "_loaded": None}


class Ungroup(grain.experimental.FlatMapTransform):
    """A group (list) of documents back into the documents, in order."""

    def __init__(self, group: int):
        self.max_fan_out = group

    def flat_map(self, element):
        return element


def _as_list(elements):
    return list(elements)


def _seed(setup: Setup, index: int) -> int:
    return int(np.random.SeedSequence([setup.seed, index]).generate_state(1, np.uint32)[0])


def documents(setup: Setup) -> grain.MapDataset:
    """The mixed, shuffled, endless, tokenized documents (stateless, random access); with
    ``setup.image_size``, the one image-text dataset's, shuffled and endless."""
    if setup.image_size:
        [path] = setup.files.values()
        rows = grain.MapDataset.source(ParquetRows(path)).shuffle(seed=setup.seed).repeat()
        return rows.map(EncodeImageText(setup))
    names = list(setup.files)
    parts = [
        grain.MapDataset.source(JsonLines(setup.files[name])).shuffle(seed=_seed(setup, i)).repeat()
        for i, name in enumerate(names)
    ]
    mixed = grain.MapDataset.mix(parts, weights=[float(setup.weights[name]) for name in names])
    return mixed.map(Tokenize(setup.tokenizer_json))


def _read_options(setup: Setup) -> grain.ReadOptions:
    # Grain's read thread pool, in each worker. The map (JSON + tokenizer) holds the GIL, so these
    # threads add no parallelism, yet they measured faster here than none (``read_threads=0``).
    # A small buffer keeps little work in flight (Grain's default of 500 documents fills slowly).
    return grain.ReadOptions(
        num_threads=int(setup.options.get("read_threads", 16)),
        prefetch_buffer_size=int(setup.options.get("read_buffer", 16)),
    )


def _workers(setup: Setup) -> int:
    return 0 if setup.method == "inline" else max(0, int(setup.workers))


def _parallel(ds: grain.IterDataset, setup: Setup, *, sequential_slice: bool = False):
    workers, buffer = _workers(setup), int(setup.options.get("buffer", 2))
    if setup.options.get("prefetch", "process") == "thread":
        return grain.experimental.multithread_prefetch(
            ds, num_threads=workers, buffer_size=buffer, sequential_slice=sequential_slice
        )
    options = grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=buffer)
    return ds.mp_prefetch(options, sequential_slice=sequential_slice)


def _pack_and_batch(ds: grain.IterDataset, setup: Setup) -> grain.IterDataset:
    features = ("tokens", "pixels") if setup.image_size else ("tokens",)
    lengths = dict.fromkeys(features, setup.seq_len + 1)
    ds = grain.experimental.ConcatThenSplitIterDataset(ds, length_struct=lengths)
    return ds.batch(setup.microbatch, drop_remainder=True)


def fastest_dataset(setup: Setup) -> grain.IterDataset:
    """Read, tokenize, pack and batch inside each of ``setup.workers`` processes.

    Sequential slices (worker ``i`` takes the ``i``-th contiguous share of each file): Grain's
    default strided slice ``i::workers`` of the *mixed* sequence would hand each worker the
    documents of only some datasets, as the mixture interleaves them in a fixed pattern (with
    weights 5:3:2 and 2 workers, worker 0 got only the first dataset), making single-dataset
    batches and letting the slowest worker set the pace (``options["sequential_slice"] = False``
    shows it)."""
    ds = documents(setup).to_iter_dataset(_read_options(setup))
    sequential = bool(setup.options.get("sequential_slice", True))
    return _parallel(_pack_and_batch(ds, setup), setup, sequential_slice=sequential)


def invariant_dataset(setup: Setup) -> grain.IterDataset:
    """Read and tokenize in ``setup.workers`` processes; pack and batch after, in this one."""
    group = int(setup.options.get("group", 16)) if _workers(setup) else 1
    docs = documents(setup)
    if group > 1:
        docs = docs.batch(group, batch_fn=_as_list)
    ds = _parallel(docs.to_iter_dataset(_read_options(setup)), setup)
    if group > 1:
        ds = grain.experimental.FlatMapIterDataset(ds, Ungroup(group))
    return _pack_and_batch(ds, setup)


def _outs(ds: grain.IterDataset):
    iterator = iter(ds)
    try:
        for batch in iterator:
            # Plain arrays: with several workers Grain hands batches over in shared memory, freed
            # when its array goes, so copy out rather than keep it alive in the consumer's hands.
            tokens = np.array(batch["tokens"], dtype=np.int32)
            valid = np.array(batch["tokens_segment_ids"] > 0, dtype=bool)
            if "pixels" in batch:
                np.array(batch["pixels"])  # copied out of shared memory too, as a trainer would
            del batch
            yield Out(tokens, valid)
    finally:
        iterator.close()


def batches_fastest(setup: Setup):
    """Microbatches of the fastest layout (its rows depend on the number of workers)."""
    yield from _outs(fastest_dataset(setup))


def batches_invariant(setup: Setup):
    """Microbatches of the worker-invariant layout (the same for any number of workers)."""
    yield from _outs(invariant_dataset(setup))


batches = batches_invariant  # the interface's name (common.py)


def state_bytes(iterator: grain.DatasetIterator) -> int:
    """Bytes of the JSON of a Grain iterator's checkpoint state (``get_state()``)."""
    return len(json.dumps(iterator.get_state(), default=_json_default).encode())


def _json_default(value: Any):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
