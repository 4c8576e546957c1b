"""The lane's decisions on tiny inputs, computed by hand: the mixture rule, pieces and positions,
wrap and best-fit packing, the shuffle order, microbatches and the chunk dealer."""

from __future__ import annotations

import numpy as np
import pytest
from support.mixing import chunks as _chunks
from support.mixing import from_record as _from_record

from zephon.ops import BatchRows, PackFlat, Rows, Shuffle
from zephon.ops.containers import Docs, Patches
from zephon.ops.pack import decreasing
from zephon.work import Mixer, MixRule, MixState, Position
from zephon.work.mixture import pick
from zephon.work.plan import ChunkDealer


def _mixer(streams: list[list[Docs]], shares: list[float], unit="tokens", state=None) -> Mixer:
    def fetch(d, k, skip):
        return _from_record(streams[d][k], skip) if k < len(streams[d]) else None

    names = [f"d{i}" for i in range(len(streams))]
    state = state or MixState.start(len(streams))
    return Mixer(MixRule(names, shares, unit), fetch, state, max_empty=[5] * len(streams))


def _sequence(mixer: Mixer, n: int, limit: int = 100) -> str:
    return "".join("AB"[mixer.take(limit).dataset] for _ in range(n))


def test_the_rule_takes_the_dataset_whose_next_piece_is_most_overdue():
    # A: documents of 4 tokens; B: of 1 token; half and half by tokens.
    # keys (used + next/2) / share: A 4, B 1 -> B; A 4, B 3 -> B; A 4, B 5 -> A; then B until
    # B's key passes A's 12: B at 5, 7, 9, 11 -> BBBB; then A.
    mixer = _mixer([_chunks(0, [[4] * 9]), _chunks(1, [[1] * 20])], [0.5, 0.5])
    assert _sequence(mixer, 8) == "BBABBBBA"
    assert mixer.state.used == [8, 6]


def test_a_record_mixture_counts_documents_and_ties_go_to_the_lower_index():
    # 3:1 by documents, every next piece is 1 document: keys A (u + .5)/.75, B (u + .5)/.25
    # A .67 < B 2 -> A; A 2 = B 2 -> A (tie); A 3.3 > B 2 -> B; A 3.3 -> A; A 4.7 -> A; A 6 = B 6 -> A
    mixer = _mixer([_chunks(0, [[9] * 10]), _chunks(1, [[2] * 10])], [0.75, 0.25], unit="documents")
    assert _sequence(mixer, 7) == "AABAAAB"
    assert mixer.state.used == [5, 2]


def test_pick_weighs_the_next_piece_by_half():
    assert pick([0.5, 0.5], [10, 10], [8, 2]) == 1
    assert pick([0.5, 0.5], [10, 14], [8, 2]) == 0  # (10 + 4) vs (14 + 1)
    assert pick([0.5, 0.5], [10, 13], [8, 2]) == 0  # 14 vs 14: the lower index


def test_a_document_longer_than_the_limit_comes_in_pieces_that_compete_again():
    # A: one document of 10 tokens; B: documents of 2. Pieces of at most 4 tokens.
    mixer = _mixer([_chunks(0, [[10, 3]]), _chunks(1, [[2] * 10], first_token=100)], [0.5, 0.5])
    pieces = [mixer.take(4) for _ in range(6)]
    assert [(p.dataset, p.start, p.stop) for p in pieces] == [
        (1, 0, 2),  # keys: A (0 + 2), B (0 + 1) -> B
        (0, 0, 4),  # A 2, B 3 -> the first 4 tokens of A's long document
        (1, 2, 4),  # A 4 + 2 = 6, B 2 + 1 = 3
        (1, 4, 6),  # B 4 + 1 = 5 < 6
        (0, 4, 8),  # A 6 < B 7
        (1, 6, 8),  # A 8 + 1, B 6 + 1 -> B
    ]
    assert mixer.state.positions[0] == Position(0, 0, 8)  # 8 tokens into A's first document


def test_positions_step_over_empty_chunks_and_count_what_they_left_out():
    mixer = _mixer([_chunks(0, [[2], [], [], [3]])], [1.0])
    assert mixer.take(10).stop == 2
    assert mixer.state.positions[0] == Position(3, 0, 0)  # chunks 1 and 2 have no document
    assert mixer.take_counters() == {"empty_documents": 2}
    assert mixer.take(10) is not None and mixer.take(10) is None, "the dataset stops after chunk 3"
    assert mixer.ended


def test_a_dataset_without_any_document_is_named():
    with pytest.raises(ValueError, match="dataset 'd0' gave 6 chunks in a row without a document"):
        _mixer([_chunks(0, [[]] * 50)], [1.0])


def test_a_mixer_restored_from_its_state_takes_the_same_pieces():
    streams = [_chunks(0, [[5, 7], [3, 9], [8, 8]]), _chunks(1, [[4, 4, 4], [6], [5, 5, 5]], first_token=100)]
    mixer = _mixer(streams, [0.3, 0.7])
    for _ in range(3):
        mixer.take(6)
    state = MixState.from_json(mixer.state.to_json(), 2)
    assert state.positions[0].record > 0, "resumes inside a chunk: read from that record on"
    rest = [p.docs.tokens[p.start : p.stop].tolist() for p in (mixer.take(6) for _ in range(5))]
    again = _mixer(streams, [0.3, 0.7], state=state)
    assert [p.docs.tokens[p.start : p.stop].tolist() for p in (again.take(6) for _ in range(5))] == rest


def test_wrap_fills_rows_end_to_end_and_restarts_positions_at_documents_and_cuts():
    # documents of 3, 4, 2 and 6 tokens, tokens 1..15; rows of 5 tokens (max_length 4)
    mixer = _mixer([_chunks(0, [[3, 4, 2, 6]])], [1.0])
    rows = PackFlat(4).fill(mixer, 2)
    assert rows.tokens.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    assert rows.positions.tolist() == [[0, 1, 2, 0, 1], [0, 1, 0, 1, 0]]
    assert (rows.sources == 0).all()
    assert mixer.state.positions[0] == Position(0, 6, 1)  # token 11: record 6 (document 3), offset 1
    rest = PackFlat(4).fill(mixer, 2)
    assert rest.tokens.tolist() == [[11, 12, 13, 14, 15]]  # the dataset stopped: one row left


def test_wrap_with_two_datasets_cuts_pieces_at_the_row_end():
    a, b = _chunks(0, [[4, 4, 4]]), _chunks(1, [[3, 3, 3]], first_token=100)
    rows = PackFlat(5).fill(_mixer([a, b], [0.5, 0.5]), 2)  # rows of 6, keys (used + next/2) / .5
    # row 0: A 4 vs B 3 -> B's 3; 3 left: A min(4, 3) -> 3 vs B 9 -> A cut after 3 tokens
    # row 1: A's last token 7 vs B 9 -> A (1); A 12 vs B 9 -> B's 3; 2 left: A 10 vs B 14 -> A cut
    assert rows.tokens.tolist() == [[100, 101, 102, 1, 2, 3], [4, 103, 104, 105, 5, 6]]
    assert rows.positions.tolist() == [[0, 1, 2, 0, 1, 2], [0, 0, 1, 2, 0, 1]]
    assert rows.sources.tolist() == [[1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 0, 0]]


def _image_chunk(lengths: list[int], images: list[int], first_token: int) -> Docs:
    """A chunk of documents of the given lengths whose first ``images[i]`` tokens are image
    tokens, each with a patch of 12 distinct bytes."""
    docs = _chunks(0, [lengths], first_token)[0]
    mask = np.zeros(len(docs.tokens), bool)
    for start, k in zip(docs.offsets[:-1].tolist(), images, strict=True):
        mask[start : start + k] = True
    count = int(mask.sum())
    pixels = (np.arange(count * 12) % 251).astype(np.uint8).reshape(count, 12) + first_token % 5
    grid = np.stack([np.arange(count), np.full(count, 2), np.full(count, 3)], axis=1).astype(np.int32)
    docs.patches = Patches(pixels, grid)
    docs.patch_at = np.concatenate([[0], np.cumsum(mask)]).astype(np.int64)
    return docs


@pytest.mark.parametrize("images", [False, True])
def test_rows_built_in_the_shuffled_order_are_the_packed_rows_permuted(images):
    # best-fit rows end in padding and differ in length: each row's tokens, places, documents
    # and patches must move with it, whatever order the shuffle gives the rows
    lengths = [7, 3, 9, 2, 5, 8, 4, 6, 1, 9, 3]
    if images:
        chunk = _image_chunk(lengths, [k % 4 for k in lengths], first_token=1)
    else:
        chunk = _chunks(0, [lengths])[0]
    pack = PackFlat(9, "best_fit")

    def fill(order=None):
        fetch = lambda d, k, skip: chunk if k == 0 else None  # noqa: E731 - read from the start
        mixer = Mixer(MixRule(["d0"], [1.0], "tokens"), fetch, MixState.start(1), max_empty=[5])
        return pack.fill(mixer, 5, order)

    plain = fill()
    assert (plain.vision is not None) == images
    assert len({int((row >= 0).sum()) for row in plain.sources}) > 1  # rows of different lengths
    for seed in range(4):
        order = np.random.default_rng(seed).permutation(5)
        shuffled, expected = fill(lambda n, order=order: order[:n]), plain.take(order)
        for name in Rows.FIELDS:
            assert np.array_equal(getattr(shuffled, name), getattr(expected, name)), name
        if images:
            got, want = shuffled.vision, expected.vision
            assert np.array_equal(got.mask, want.mask) and np.array_equal(got.offsets, want.offsets)
            assert np.array_equal(got.patches.pixels, want.patches.pixels)
            assert np.array_equal(got.patches.grid, want.patches.grid)
        else:
            assert shuffled.vision is None and expected.vision is None


def test_best_fit_packs_a_prefix_decreasing_then_stops_at_the_first_misfit():
    # rows of 10, 2 rows: 6+5+4+3+2 = 20 fits the window; BFD: [6, 4] and [5, 3, 2]; 9 fits nowhere
    mixer = _mixer([_chunks(0, [[6, 5, 4, 3, 2, 9]])], [1.0])
    rows = PackFlat(9, "best_fit").fill(mixer, 2)
    assert rows.tokens.tolist() == [
        [1, 2, 3, 4, 5, 6, 12, 13, 14, 15],
        [7, 8, 9, 10, 11, 16, 17, 18, 19, 20],
    ]
    assert rows.positions.tolist() == [[0, 1, 2, 3, 4, 5, 0, 1, 2, 3], [0, 1, 2, 3, 4, 0, 1, 2, 0, 1]]
    assert mixer.state.positions[0] == Position(0, 10, 0)  # the 9-token document opens the next window


def test_best_fit_gives_back_what_does_not_fit_after_fragmentation():
    # three documents of 6 tokens fit 20 tokens but need 3 rows of 10: two are packed, padded
    mixer = _mixer([_chunks(0, [[6] * 5])], [1.0])
    rows = PackFlat(9, "best_fit", pad_id=0).fill(mixer, 2)
    assert rows.tokens.tolist() == [[1, 2, 3, 4, 5, 6, 0, 0, 0, 0], [7, 8, 9, 10, 11, 12, 0, 0, 0, 0]]
    assert rows.sources.tolist() == [[0] * 6 + [-1] * 4] * 2
    assert mixer.state.positions[0] == Position(0, 4, 0)
    assert mixer.state.used == [12]


def test_best_fit_decreasing_by_hand():
    assert decreasing([6, 5, 4, 3, 2], 10) == [[0, 2], [1, 3, 4]]
    assert decreasing([3, 3, 3, 3], 10) == [[0, 1, 2], [3]]
    assert decreasing([10, 1], 10) == [[0], [1]]


def test_shuffle_order_is_a_seeded_permutation_per_lane_and_window():
    shuffle = Shuffle(4, seed=3)
    order = shuffle.order(10, lane=1, window=2)
    assert sorted(order.tolist()) == list(range(10))
    assert order.tolist() == shuffle.order(10, lane=1, window=2).tolist()
    assert order.tolist() != shuffle.order(10, lane=1, window=3).tolist()
    assert order.tolist() != shuffle.order(10, lane=2, window=2).tolist()
    # a buffer of 4: the first row out is one of the first 4 in
    assert order[0] < 4
    assert sorted(Shuffle(16).order(5, 0, 0).tolist()) == [0, 1, 2, 3, 4]


def test_batch_cuts_microbatches_and_pads_only_a_short_last_one():
    rows = Rows.padding(5, 3, 7)
    rows.sources[:] = 0
    parts = BatchRows(2, pad_id=9).split(rows)
    assert [len(p) for p in parts] == [2, 2, 2]
    assert (parts[2].sources[1] == -1).all() and (parts[2].tokens[1] == 9).all()
    assert (parts[2].sources[0] == 0).all()


def test_the_dealer_gives_each_chunk_of_an_epoch_to_exactly_one_lane():
    dealer = ChunkDealer("d", num_chunks=5, seed=1, num_lanes=2, repeat=False)
    lane0 = [dealer.chunk_index(0, k) for k in range(4)]
    lane1 = [dealer.chunk_index(1, k) for k in range(3)]
    perm = dealer.permutation(0).tolist()
    assert lane0 == [perm[0], perm[2], perm[4], None]  # positions 0, 2, 4 of the epoch
    assert lane1 == [perm[1], perm[3], None]
    again = ChunkDealer("d", num_chunks=5, seed=1, num_lanes=2, repeat=True)
    assert [again.chunk_index(1, k) for k in range(3)] == [perm[1], perm[3], again.permutation(1)[0]]
    assert again.permutation(1).tolist() != perm


@pytest.mark.parametrize("unit", ["tokens", "documents"])
@pytest.mark.parametrize("seed", range(12))
def test_runs_take_exactly_the_pieces_the_rule_takes_one_by_one(unit, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4))
    means = rng.choice([3, 20, 90, 400], size=n)

    def streams():
        rng_docs = np.random.default_rng(seed + 100)
        out = []
        for d in range(n):
            chunks = [list(rng_docs.integers(1, 2 * means[d], rng_docs.integers(0, 120))) for _ in range(30)]
            out.append(_chunks(d, chunks, first_token=1 + 100_000 * d))
        return out

    shares = list(rng.dirichlet(np.ones(n)))
    row_len = int(rng.choice([7, 64, 129, 1025]))  # 1025: runs of tens of documents

    def stream(runs: bool) -> tuple[list[int], list[int]]:
        mixer, tokens, filled = _mixer(streams(), shares, unit=unit), [], 0
        while True:  # to the end of the first dataset that runs out
            piece = mixer.take(row_len - filled % row_len, runs=runs)
            if piece is None:
                break
            tokens += piece.docs.tokens[piece.start : piece.stop].tolist()
            filled += len(piece)
        return tokens, mixer.state.used

    assert stream(runs=True) == stream(runs=False)


@pytest.mark.parametrize("unit", ["tokens", "documents"])
@pytest.mark.parametrize("n", [2, 3])
def test_runs_break_ties_as_the_rule_does(unit, n):
    # equal shares and documents of equal length: keys tie all the time, and a tie goes to the
    # lower index, inside a run as in a single take
    streams = lambda: [_chunks(d, [[4] * 40] * 3, first_token=1 + 1000 * d) for d in range(n)]  # noqa: E731

    def stream(runs: bool) -> list[int]:
        mixer, tokens, filled = _mixer(streams(), [1 / n] * n, unit=unit), [], 0
        while (piece := mixer.take(64 - filled % 64, runs=runs)) is not None:
            tokens += piece.docs.tokens[piece.start : piece.stop].tolist()
            filled += len(piece)
        return tokens + mixer.state.used

    assert stream(runs=True) == stream(runs=False)


@pytest.mark.parametrize("unit", ["tokens", "documents"])
@pytest.mark.parametrize("seed", range(4))
def test_long_runs_take_what_the_rule_takes_one_by_one(unit, seed):
    # a dataset of one- and two-token documents next to one of long ones: runs of hundreds of
    # documents, where the search for a run's end gallops far (counted: such runs are taken)
    rng = np.random.default_rng(seed)
    streams = lambda: [  # noqa: E731
        _chunks(0, [list(rng_docs.integers(1, 3, 600)) for _ in range(6)]),
        _chunks(1, [list(rng_docs.integers(200, 900, 20)) for _ in range(6)], first_token=10**6),
    ]
    shares = [float(rng.uniform(0.98, 0.995)), 0.0]
    shares[1] = 1 - shares[0]
    longest = 0

    def stream(runs: bool) -> list[int]:
        nonlocal rng_docs, longest
        rng_docs = np.random.default_rng(seed + 7)
        mixer, tokens, filled = _mixer(streams(), shares, unit=unit), [], 0
        while True:
            piece = mixer.take(2049 - filled % 2049, runs=runs)
            if piece is None:
                return tokens + mixer.state.used
            tokens += piece.docs.tokens[piece.start : piece.stop].tolist()
            filled += len(piece)
            docs = np.searchsorted(piece.docs.offsets, piece.stop) - piece.doc
            longest = max(longest, int(docs)) if runs else longest

    rng_docs = None
    assert stream(runs=True) == stream(runs=False)
    assert longest >= (600 if unit == "tokens" else 50)  # a whole chunk; shares of 49:1 and more
