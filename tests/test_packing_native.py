"""Pieces laid end to end by the compiled gather (``zephon/ops/_rows.c``) hold exactly what the
Python lays out: tokens, places in their documents (restarting where a piece continues a cut
document), datasets and document starts; on pieces of generated mixtures, wrapped and best-fit,
in the order a shuffle puts them, and from chunks read from a record on."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.mixing import chunks, from_record

from zephon import Dataset, MixtureWorkSource, Pipeline, batch, lanes
from zephon.batch import Batch
from zephon.io.formats import lines
from zephon.ops import pack, tokenize
from zephon.ops.containers import Docs
from zephon.ops.pack import best_fit, by_row, laid_end_to_end, wrap
from zephon.testing import drain
from zephon.testing.data import real_text_corpora
from zephon.work import Mixer, MixRule, MixState, mixture
from zephon.work.mixture import Piece


def test_the_compiled_gather_is_built():
    built = pack._gather is not None
    assert built, "zephon.ops._rows was not built: pip install -e . needs a C compiler"


# the rest compares the compiled part with its twin: without it, the test above says why
needs_compiled = pytest.mark.skipif(
    pack._gather is None, reason="zephon.ops._rows not built: see the test above"
)


def _both(pieces: list, monkeypatch) -> tuple[tuple, tuple]:
    total = sum(p.stop - p.start for p in pieces)
    compiled = laid_end_to_end(pieces, total)
    with monkeypatch.context() as m:
        m.setattr(pack, "_gather", None)
        python = laid_end_to_end(pieces, total)
    return compiled, python


def _assert_same(compiled: tuple, python: tuple) -> None:
    for a, b in zip(compiled, python, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@needs_compiled
@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(1, 3),
    row_len=st.sampled_from([1, 5, 64, 700]),
    algorithm=st.sampled_from(["wrap", "best_fit"]),
    skip=st.integers(0, 6),
)
def test_compiled_and_python_lay_out_the_same_rows(seed, n, row_len, algorithm, skip):
    rng = np.random.default_rng(seed)
    streams = []
    for d in range(n):
        docs = chunks(
            d, [list(rng.integers(1, rng.choice([4, 60, 900]), rng.integers(0, 40))) for _ in range(4)]
        )
        streams.append(docs)

    def fetch(d, k, record):
        return from_record(streams[d][k], record + (skip if k == 0 else 0)) if k < len(streams[d]) else None

    names = [f"d{i}" for i in range(n)]
    mixer = Mixer(
        MixRule(names, list(rng.dirichlet(np.ones(n))), "tokens"), fetch, MixState.start(n), [8] * n
    )
    rows = 6
    if algorithm == "wrap":
        pieces, lengths = wrap(mixer, rows, row_len)
        bins = by_row(pieces, lengths)
    else:
        bins = best_fit(mixer, rows, row_len)
    order = rng.permutation(len(bins)).tolist()  # as build_rows lays them out after a shuffle
    pieces = [p for r in order for p in bins[r]]
    if not pieces:
        return
    _assert_same(*_both(pieces, pytest.MonkeyPatch()))


@needs_compiled
def test_a_piece_continuing_a_cut_document_counts_its_places_from_zero(monkeypatch):
    # one document of 10 tokens cut at 4 and 7, and a run of the next two documents after it
    [docs] = chunks(0, [[10, 3, 2]])
    pieces = [Piece(0, docs, 0, 4, 7), Piece(0, docs, 0, 7, 15), Piece(0, docs, 0, 0, 4)]
    compiled, python = _both(pieces, monkeypatch)
    _assert_same(compiled, python)
    places = [[0, 1, 2], [0, 1, 2, 0, 1, 2, 0, 1], [0, 1, 2, 3]]  # piece by piece
    assert compiled[1].tolist() == [x for piece in places for x in piece]
    assert compiled[3].tolist() == [False] * 3 + [False, False, False, True, False, False, True, False] + [
        True, False, False, False,
    ]  # fmt: skip


@needs_compiled
def test_a_chunk_whose_tokens_are_not_int32_is_refused_not_misread():
    [docs] = chunks(0, [[3, 2]])
    wrong = Docs(docs.tokens.astype(np.float32), docs.offsets, docs.records, 0)
    out = (np.empty(3, np.int32), np.empty(3, np.int32), np.empty(3, np.int16), np.empty(3, bool))
    with pytest.raises(TypeError, match="tokens must be a flat array of 4-byte integers"):
        pack._gather([Piece(0, wrong, 0, 0, 3)], 3, *out)
    with pytest.raises(ValueError, match="pieces past total"):
        pack._gather([Piece(0, docs, 0, 0, 3), Piece(0, docs, 1, 3, 5)], 3, *out)


def test_a_pipeline_without_its_compiled_parts_gives_the_same_batches_and_says_so(
    tmp_path, gpt2, monkeypatch, caplog
):
    files = {name: path for name, (path, _) in real_text_corpora(str(tmp_path)).items()}

    def digests() -> list:
        datasets = [Dataset.from_path(name, path, exhausted="repeat") for name, path in files.items()]
        shares = {"verses": 0.4, "chapters": 0.35, "code": 0.25}
        source = MixtureWorkSource(datasets, shares, unit="tokens", seed=3)
        p = Pipeline(source).options(num_lanes=3).tokenize(gpt2).pack_flat(511).shuffle(64, seed=3).batch(4)
        got = [b.digest() for b in drain(p, 90)]
        stats = p.stats()  # tokens and documents delivered by dataset: the delivery's counts
        return [*got, stats["tokens"], stats["documents"]]

    compiled = digests()
    monkeypatch.setattr(mixture, "_compiled", None)
    monkeypatch.setattr(batch, "_count_by_dataset", None)
    monkeypatch.setattr(pack, "_gather", None)
    monkeypatch.setattr(tokenize, "_lay_out", None)
    monkeypatch.setattr(lines, "_objects_per_line", None)
    monkeypatch.setattr(lanes, "_SAID_PYTHON", [])
    with caplog.at_level(logging.WARNING, logger="zephon.lanes"):
        python = digests()
    assert python == compiled
    names = "zephon.work._shares, zephon.ops._rows, zephon.ops._docs, zephon.io.formats._lines"
    assert f"{names} not built" in caplog.text


@needs_compiled
def test_the_compiled_gather_reads_each_piece_once_whatever_its_attributes_do():
    # a piece whose chunk is made anew at each read: each made chunk is held while in use, so
    # another one made at the same address is not taken for it
    [first, second] = chunks(0, [[4], [4]], first_token=100)

    class Made:
        def __init__(self, docs):
            self.dataset, self.doc, self.start, self.stop, self._docs = 0, 0, 0, 4, docs

        @property
        def docs(self):
            return Docs(self._docs.tokens.copy(), self._docs.offsets, self._docs.records, 0)

    out = (np.empty(8, np.int32), np.empty(8, np.int32), np.empty(8, np.int16), np.empty(8, bool))
    pack._gather([Made(first), Made(second)], 8, *out)
    assert out[0].tolist() == [*first.tokens.tolist(), *second.tokens.tolist()]


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(
    runs=st.lists(st.tuples(st.integers(-1, 11), st.integers(1, 40)), min_size=1, max_size=30),
    rows=st.integers(1, 4),
    seed=st.integers(0, 2**31),
    with_starts=st.booleans(),
)
def test_compiled_and_numpy_count_a_batch_s_tokens_and_documents_alike(runs, rows, seed, with_starts):
    num_datasets = max(d for d, _ in runs) + 1 + seed % 3  # some datasets with no token here
    flat = np.concatenate([np.full(size, d, np.int16) for d, size in runs])
    flat = np.resize(flat, rows * -(-len(flat) // rows)).reshape(rows, -1)
    rng = np.random.default_rng(seed)
    starts = (rng.random(flat.shape) < 0.2) & (flat >= 0) if with_starts else None
    b = Batch(0, 0, np.zeros(flat.shape, np.int32), np.zeros(flat.shape, np.int32), flat, starts)
    tokens, documents = b.counts_per_dataset(num_datasets)
    np.testing.assert_array_equal(tokens, b.tokens_per_dataset(num_datasets))
    np.testing.assert_array_equal(documents, b.documents_per_dataset(num_datasets))
    assert tokens.dtype == documents.dtype == np.int64
    assert tokens.sum() == (flat >= 0).sum()


@needs_compiled
def test_the_compiled_counts_read_a_view_and_refuse_what_they_would_misread():
    sources = np.array([[0, 0, 1, -1], [1, 1, 0, 0]], np.int16)
    starts = np.array([[1, 0, 1, 0], [0, 1, 1, 0]], bool)
    b = Batch(0, 0, sources.astype(np.int32), sources.astype(np.int32), sources[:, ::-1], starts[:, ::-1])
    tokens, documents = b.counts_per_dataset(2)  # a view in another order is copied, not misread
    assert tokens.tolist() == [4, 3] and documents.tolist() == [2, 2]
    # a source past the datasets given is an error, and nothing is written past the arrays given
    guarded = np.zeros(3, np.int64), np.zeros(3, np.int64)
    with pytest.raises(ValueError, match="source 1 past the 1 datasets given"):
        batch._count_by_dataset(sources, starts, guarded[0][:1], guarded[1][:1])
    assert guarded[0][1:].tolist() == [0, 0] and guarded[1][1:].tolist() == [0, 0]
    on_padding = starts.copy()
    on_padding[0, 3] = True
    with pytest.raises(ValueError, match="a document start on padding"):
        batch._count_by_dataset(sources, on_padding, np.zeros(2, np.int64), np.zeros(2, np.int64))
    out = np.zeros(2, np.int64), np.zeros(2, np.int64)
    for wrong in (
        (sources.astype(np.int32), starts, *out),
        (sources, starts[:, :3].copy(), *out),
        (sources, starts, np.zeros(2, np.int32), out[1]),
        (sources, starts, out[0], np.zeros(3, np.int64)),
        (sources, starts, out[0], np.zeros(2, np.float64)),
        (sources, starts, out[0], np.zeros(2, np.uint64)),
        (sources.astype(np.uint16), starts, *out),
        (sources, starts.astype(np.int16), *out),
    ):
        with pytest.raises(ValueError, match="count_by_dataset"):
            batch._count_by_dataset(*wrong)
    read_only = np.zeros(2, np.int64)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        batch._count_by_dataset(sources, None, out[0], read_only)


@pytest.mark.parametrize("runner", ["thread", "inline"])
def test_the_deliverys_counts_are_made_where_the_batch_is_made_and_count_what_is_delivered(
    corpus, gpt2, monkeypatch, runner
):
    """With a background runner, in the lanes' thread, where the batch's arrays were just
    written: counted in the consumer's, the thread a training loop waits on, they took a
    millisecond a batch there once it had slept (its caches cold), against 20 us warm."""
    import threading

    import numpy as np

    where, real = [], batch.Batch.counts_per_dataset
    # a lanes thread of an earlier test, closed but ending the batch it was making (close never
    # waits for it), may count one more batch meanwhile: only this test's threads are heard
    earlier = set(threading.enumerate()) - {threading.current_thread()}

    def counting(self, num_datasets):
        if threading.current_thread() not in earlier:
            where.append(threading.current_thread().name)
        return real(self, num_datasets)

    monkeypatch.setattr(batch.Batch, "counts_per_dataset", counting)
    datasets = [Dataset.from_path(name, corpus, exhausted="repeat") for name in ("a", "b")]
    source = MixtureWorkSource(datasets, {"a": 0.7, "b": 0.3}, unit="tokens", seed=3)
    p = Pipeline(source).options(num_lanes=2, runner=runner, chunk_bytes=4096)
    p = p.tokenize(gpt2, parallelism=0 if runner == "inline" else 2)
    p = p.pack_flat(128).shuffle(8, seed=1).batch(2)
    got = drain(p, 30)
    tokens, documents = np.zeros(2, np.int64), np.zeros(2, np.int64)
    for b in got:
        valid = b.sources >= 0
        tokens += np.bincount(b.sources[valid], minlength=2)
        documents += np.bincount(b.sources[b.starts], minlength=2)
    stats = p.stats()
    assert [stats["tokens"][n] for n in "ab"] == tokens.tolist()
    assert [stats["documents"][n] for n in "ab"] == documents.tolist()
    assert len(where) >= 30
    want = threading.main_thread().name if runner == "inline" else "zephon-lanes"
    assert set(where) == {want}, where
