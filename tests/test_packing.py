"""Exactly once, padding and labels: what packing does to every token."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from zephon import Dataset, Pipeline
from zephon.io.tokenizer import load_tokenizer
from zephon.testing import drain

EOS = 50256


def _docs_from_batches(batches) -> Counter:
    """Split every lane's delivered token stream at EOS: the documents it delivered."""
    by_lane: dict[int, list[np.ndarray]] = {}
    for b in sorted(batches, key=lambda b: (b.lane, b.index)):
        rows = [row[src >= 0] for row, src in zip(b.tokens, b.sources, strict=True)]
        by_lane.setdefault(b.lane, []).extend(rows)
    docs: Counter = Counter()
    for rows in by_lane.values():
        stream = np.concatenate(rows)
        ends = np.flatnonzero(stream == EOS)
        assert len(ends) and ends[-1] == len(stream) - 1, "a lane's stream ends inside a document"
        for a, b in zip(np.concatenate([[-1], ends[:-1]]), ends, strict=True):
            docs[tuple(stream[a + 1 : b + 1].tolist())] += 1
    return docs


def _expected_docs(texts, gpt2) -> Counter:
    tok = load_tokenizer(gpt2)
    return Counter(tuple([*ids, EOS]) for ids in tok.encode_batch(texts) if ids)


@pytest.mark.parametrize("num_lanes", [1, 3, 8])
def test_within_an_epoch_every_document_appears_exactly_once_across_all_lanes(
    corpus, corpus_docs, gpt2, num_lanes
):
    ds = Dataset.from_path("synthetic", corpus)  # exhausted="stop": exactly one epoch
    pipeline = (
        Pipeline(ds)
        .options(num_lanes=num_lanes, chunk_bytes=4096)
        .tokenize(gpt2)
        .pack_flat(max_length=50)
        .batch(microbatch_size=3)
    )
    batches = drain(pipeline, 10**6)
    assert _docs_from_batches(batches) == _expected_docs([d["text"] for d in corpus_docs], gpt2)


def _rows(batches) -> Counter:
    return Counter(
        (b.lane, row.tobytes(), src.tobytes())
        for b in batches
        for row, src in zip(b.tokens, b.sources, strict=True)
        if (src >= 0).any()
    )


def test_a_shuffle_permutes_the_rows_that_wrap_packing_makes_and_nothing_else(corpus, gpt2):
    def run(shuffle: bool):
        p = Pipeline(Dataset.from_path("synthetic", corpus)).options(num_lanes=3, chunk_bytes=4096)
        p = p.tokenize(gpt2).pack_flat(max_length=50)
        return drain((p.shuffle(10, seed=3) if shuffle else p).batch(microbatch_size=3), 10**6)

    plain, shuffled = run(False), run(True)
    assert _rows(shuffled) == _rows(plain)
    assert [b.digest() for b in shuffled[:20]] != [b.digest() for b in plain[:20]]


def _last_window_start(batches, lane: int, pipeline) -> int:
    """Index of the first batch of the lane's last window."""
    last, ops = max(b.index for b in batches if b.lane == lane), pipeline.spec().lane_ops()
    start, window = 0, 0
    while start + ops.rows_in(window) // ops.batch.microbatch_size <= last:
        start += ops.rows_in(window) // ops.batch.microbatch_size
        window += 1
    return start


@pytest.mark.parametrize("algorithm", ["wrap", "best_fit"])
def test_no_microbatch_holds_an_empty_row_before_a_stopping_dataset_ends(corpus, gpt2, algorithm):
    ds = Dataset.from_path("synthetic", corpus)
    pipeline = (
        Pipeline(ds)
        .options(num_lanes=2, chunk_bytes=4096)
        .tokenize(gpt2)
        .pack_flat(max_length=50, algorithm=algorithm)
        .shuffle(8, seed=1)
        .batch(microbatch_size=4)
    )
    batches = drain(pipeline, 10**6)
    assert len(batches) > 2 * 8 * pipeline.spec().window_rows() // 4, "the run should cover several windows"
    for b in batches:
        empty = int(((b.sources >= 0).sum(axis=1) == 0).sum())
        padded = int((b.sources < 0).sum())
        in_last_window = b.index >= _last_window_start(batches, b.lane, pipeline)
        if not in_last_window:
            assert empty == 0, f"lane {b.lane} batch {b.index} holds {empty} empty rows"
            if algorithm == "wrap":
                assert padded == 0, f"lane {b.lane} batch {b.index} holds {padded} padding tokens"
    wrap_padding = sum(int((b.sources < 0).sum()) for b in batches) / sum(b.sources.size for b in batches)
    if algorithm == "wrap":  # only each lane's very last row and microbatch are filled up
        assert wrap_padding < 4 * 51 * 2 / sum(b.sources.size for b in batches) + 1e-9


def test_padding_is_only_ever_at_a_row_end_and_its_labels_are_ignored(corpus, gpt2):
    ds = Dataset.from_path("synthetic", corpus)
    pipeline = Pipeline(ds).options(num_lanes=2, chunk_bytes=4096).tokenize(gpt2)
    pipeline = pipeline.pack_flat(max_length=50, algorithm="best_fit").batch(microbatch_size=4)
    batches = drain(pipeline, 10**6)
    padded = [b for b in batches if (b.sources < 0).any()]
    assert padded, "best-fit rows end in padding"
    for b in padded:
        t = b.to_training()
        pad = b.sources[:, 1:] < 0
        assert (t["labels"][pad] == -100).all()
        assert (t["labels"][~pad] >= 0).all()
        for row in b.sources:
            valid = np.flatnonzero(row >= 0)
            assert len(valid) == 0 or valid[-1] == len(valid) - 1
    delivered = sum(int((b.sources >= 0).sum()) for b in batches)
    assert delivered == sum(pipeline.stats()["tokens"].values())


def test_to_training_shifts_labels_and_restarts_positions_at_each_document(corpus, gpt2):
    ds = Dataset.from_path("synthetic", corpus)
    pipeline = Pipeline(ds).options(num_lanes=1, chunk_bytes=4096)
    batch = drain(pipeline.tokenize(gpt2).pack_flat(max_length=40).batch(microbatch_size=4), 1)[0]
    t = batch.to_training()
    assert {k: (v.dtype, v.shape) for k, v in t.items()} == {
        k: (np.dtype("int64"), (4, 40)) for k in ("input_ids", "labels", "positions")
    }
    assert (t["labels"][:, :-1] == t["input_ids"][:, 1:]).all()
    assert (t["labels"][:, -1] == batch.tokens[:, -1]).all()
    ids, pos = t["input_ids"], t["positions"]
    for row in range(4):
        assert pos[row, 0] == 0
        for j in range(1, 40):
            expected = 0 if ids[row, j - 1] == EOS else pos[row, j - 1] + 1
            assert pos[row, j] == expected


def test_best_fit_keeps_documents_whole_and_loses_nothing(corpus, corpus_docs, gpt2):
    ds = Dataset.from_path("synthetic", corpus)
    pipeline = (
        Pipeline(ds)
        .options(num_lanes=2, chunk_bytes=4096, window_rows=16)
        .tokenize(gpt2)
        .pack_flat(max_length=200, algorithm="best_fit")
        .batch(microbatch_size=2)
    )
    batches = drain(pipeline, 10**6)
    expected = _expected_docs([d["text"] for d in corpus_docs], gpt2)
    delivered: Counter = Counter()
    for b in batches:
        for row, src in zip(b.tokens, b.sources, strict=True):
            valid = row[src >= 0]
            if len(valid) == 0:
                continue  # a padding row that fills the window's last microbatch
            ends = np.flatnonzero(valid == EOS)
            assert ends[-1] == len(valid) - 1, "a row splits a short document"
            for a, e in zip(np.concatenate([[-1], ends[:-1]]), ends, strict=True):
                delivered[tuple(valid[a + 1 : e + 1].tolist())] += 1
    long_docs = {d for d in expected if len(d) > 201}
    assert not long_docs, "the corpus should hold no document longer than a row"
    assert delivered == expected
    rows = np.concatenate([b.sources for b in batches])
    rows = rows[(rows >= 0).any(axis=1)]  # leave out padding rows that fill the last microbatch
    fill = (rows >= 0).mean()
    assert fill > 0.92, f"best_fit should fill its rows, got {fill:.3f}"


def test_best_fit_splits_a_document_longer_than_a_row(tmp_path, gpt2):
    from zephon.testing import write_jsonl

    long = " ".join(["river"] * 300)
    write_jsonl(str(tmp_path / "d.jsonl"), [{"text": long}, {"text": "stone"}])
    ds = Dataset.from_path("d", str(tmp_path / "d.jsonl"))
    pipeline = Pipeline(ds).tokenize(gpt2).pack_flat(max_length=99, algorithm="best_fit").batch(1)
    rows = [b for b in drain(pipeline, 100)]
    tokens = [int(x) for b in rows for x in b.tokens[0][b.sources[0] >= 0]]
    assert sorted(tokens) == sorted(
        load_tokenizer(gpt2).encode_batch([long, "stone"])[0]
        + load_tokenizer(gpt2).encode_batch(["stone"])[0]
        + [EOS, EOS]
    )
    assert all(b.positions[0, 0] == 0 for b in rows)
    assert max(int(b.positions.max()) for b in rows) <= 99
