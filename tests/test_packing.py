"""Exactly once, padding and labels: what packing does to every token."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from zephon import Dataset, Pipeline
from zephon.io.tokenizer import load_tokenizer
from zephon.testing import check_conformance, drain, run_job

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


# -- rules for document masking: positions per document or per row, a bound on a row's documents


def _make(corpus, gpt2, *, world=1, rank=0, algorithm="wrap", exhausted="stop", shuffle=True, **packing):
    ds = Dataset.from_path("synthetic", corpus, exhausted=exhausted)
    pipeline = (
        Pipeline(ds)
        .options(num_lanes=4, chunk_bytes=4096, dp_rank=rank, dp_world_size=world)
        .tokenize(gpt2)
        .pack_flat(50, algorithm=algorithm, **packing)
    )
    return (pipeline.shuffle(8, seed=1) if shuffle else pipeline).batch(microbatch_size=2)


def _documents_per_row(batch) -> np.ndarray:
    """The documents TorchTitan finds in each row's inputs: where positions are 0."""
    return (batch.to_training()["positions"] == 0).sum(axis=1)


@pytest.mark.parametrize(("algorithm", "most"), [("wrap", 1), ("wrap", 3), ("best_fit", 2)])
def test_max_documents_per_row_bounds_every_rows_documents_and_pads_the_rest(corpus, gpt2, algorithm, most):
    batches = drain(_make(corpus, gpt2, algorithm=algorithm, max_documents_per_row=most), 10**6)
    counts = np.concatenate([_documents_per_row(b) for b in batches])
    assert counts.max() == most and counts.min() >= 1
    free = np.concatenate(
        [_documents_per_row(b) for b in drain(_make(corpus, gpt2, algorithm=algorithm), 50)]
    )
    assert free.max() > most, "without the bound rows hold more"
    for b in batches:
        t, pad = b.to_training(), b.sources[:, 1:] < 0
        assert (t["labels"][pad] == -100).all() and (t["labels"][~pad] >= 0).all()
        for row in b.sources:  # padding only at a row's end
            valid = np.flatnonzero(row >= 0)
            assert len(valid) == 0 or valid[-1] == len(valid) - 1


def test_a_bounded_wrap_delivers_every_document_once_and_counts_only_real_tokens(corpus, corpus_docs, gpt2):
    pipeline = _make(corpus, gpt2, max_documents_per_row=2)
    batches = sorted(drain(pipeline, 10**6), key=lambda b: (b.lane, b.index))
    unshuffled = _make(corpus, gpt2, max_documents_per_row=2, shuffle=False)  # rows in packing order
    assert _docs_from_batches(drain(unshuffled, 10**6)) == _expected_docs(
        [d["text"] for d in corpus_docs], gpt2
    )
    delivered = sum(int((b.sources >= 0).sum()) for b in batches)
    assert delivered == sum(pipeline.stats()["tokens"].values())
    assert sum(int((b.sources < 0).sum()) for b in batches) > 0, "bounded rows end in padding"


@pytest.mark.parametrize("algorithm", ["wrap", "best_fit"])
def test_bounded_packing_gives_the_same_global_steps_on_1_2_and_4_ranks_and_resumes(corpus, gpt2, algorithm):
    def rank(world, r):
        return _make(corpus, gpt2, world=world, rank=r, algorithm=algorithm, exhausted="repeat",
                    max_documents_per_row=3)  # fmt: skip

    steps = 6
    baseline, _ = run_job(rank, 1, steps, 1)
    for world in (2, 4):
        assert run_job(rank, world, steps, 1)[0] == baseline
    first, state = run_job(rank, 2, 2, 1)
    rest, _ = run_job(rank, 4, steps - 2, 1, state=state)
    assert {**first, **rest} == baseline
    check_conformance(lambda: rank(1, 0), steps=10, every=3)


def test_without_document_mask_positions_count_the_whole_row_and_the_tokens_stay(corpus, gpt2):
    masked = drain(_make(corpus, gpt2), 12)
    whole = drain(_make(corpus, gpt2, document_mask=False), 12)
    for a, b in zip(masked, whole, strict=True):
        assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.sources, b.sources)
        assert (b.positions == np.arange(51)).all()
    assert max(_documents_per_row(a).max() for a in masked) > 1
    assert [a.digest() for a in masked] != [b.digest() for b in whole]


def test_the_packing_rules_shape_the_data_and_a_restore_under_another_is_refused_by_name(corpus, gpt2):
    base = _make(corpus, gpt2)
    pack = next(op for op in base.fingerprint()["operators"] if op["kind"] == "pack_flat")
    assert sorted(pack) == ["algorithm", "kind", "max_length", "pad_id"], "older checkpoints still load"
    state = _make(corpus, gpt2, max_documents_per_row=4).state_dict()
    with pytest.raises(ValueError, match=r"max_documents_per_row"):
        _make(corpus, gpt2, max_documents_per_row=5).load_state_dict(state)
    with pytest.raises(ValueError, match=r"document_mask"):
        _make(corpus, gpt2, document_mask=False).load_state_dict(base.state_dict())


@pytest.mark.parametrize(
    ("packing", "message"),
    [
        (dict(max_documents_per_row=0), "max_documents_per_row=0"),
        (
            dict(document_mask=False, max_documents_per_row=2),
            "with document_mask=False a row is one document",
        ),
        (dict(document_mask="yes"), "document_mask='yes'"),
    ],
)
def test_impossible_packing_rules_are_refused(corpus, gpt2, packing, message):
    with pytest.raises(ValueError, match=message):
        _make(corpus, gpt2, **packing)
