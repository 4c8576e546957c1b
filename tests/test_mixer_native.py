"""The compiled take by fixed shares (``zephon/work/_shares.c``) takes exactly the pieces the
Python one takes, and leaves the same state: on generated mixtures (shares, units, document
lengths, empty chunks, limits, runs), on ties, and past its 64-bit range, where the Python takes
over."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.mixing import chunks as _chunks
from support.mixing import from_record as _from_record

from zephon.work import Mixer, MixRule, MixState, Position, mixture
from zephon.work.mixture import normalize


def test_the_compiled_take_is_built():
    # the install builds it (setup.py); without it every comparison below compares Python with itself
    assert mixture._compiled is not None, (
        "zephon.work._shares was not built: pip install -e . needs a C compiler"
    )


# the rest compares the compiled part with its twin: without it, the test above says why
needs_compiled = pytest.mark.skipif(
    mixture._compiled is None, reason="zephon.work._shares not built: see the test above"
)


def _mixer(streams, shares, unit, compiled: bool, state=None) -> Mixer:
    def fetch(d, k, skip):
        return _from_record(streams[d][k], skip) if k < len(streams[d]) else None

    names = [f"d{i}" for i in range(len(streams))]
    mixer = Mixer(
        MixRule(names, shares, unit), fetch, state or MixState.start(len(streams)), [8] * len(streams)
    )
    mixer.compiled = mixture._compiled if compiled else None
    return mixer


def _takes(mixer: Mixer, limits: list[int], runs: bool, row_len: int | None) -> list:
    """Each piece as numbers and the state after it, until the mixer ends or ``limits`` run out;
    with ``row_len``, each limit is the room left in a row (as the wrap packer asks)."""
    out, filled = [], 0
    for limit in limits:
        if row_len is not None:
            limit = row_len - filled % row_len
        piece = mixer.take(limit, runs=runs)
        if piece is None:
            out.append(None)
            break
        filled += len(piece)
        out.append((piece.dataset, piece.doc, piece.start, piece.stop, mixer.state.to_json()))
    return out


def _generated(weights: list[float], seed: int, chunks: int, most_docs: int):
    """Streams of ``chunks`` chunks a dataset, each of up to ``most_docs`` documents whose
    lengths run to a scale drawn per dataset (3, 40 or 600 tokens), and the shares of ``weights``."""
    rng = np.random.default_rng(seed)
    names = [f"d{i}" for i in range(len(weights))]
    streams = []
    for d in range(len(weights)):
        scale = int(rng.choice([3, 40, 600]))
        docs = [list(rng.integers(1, 2 * scale, rng.integers(0, most_docs + 1))) for _ in range(chunks)]
        streams.append(_chunks(d, docs, first_token=1 + 10**6 * d))
    return streams, normalize(dict(zip(names, weights, strict=True)), names)


@needs_compiled
@settings(max_examples=150, deadline=None)
@given(
    weights=st.lists(st.floats(0.01, 100), min_size=2, max_size=4),
    unit=st.sampled_from(["tokens", "documents"]),
    seed=st.integers(0, 2**31),
    runs=st.booleans(),
    row_len=st.sampled_from([None, 1, 7, 64, 2049]),
    limits=st.lists(st.integers(1, 3000), min_size=1, max_size=300),
)
def test_compiled_and_python_takes_give_the_same_pieces_and_state(weights, unit, seed, runs, row_len, limits):
    streams, shares = _generated(weights, seed, chunks=6, most_docs=59)
    python = _takes(_mixer(streams, shares, unit, compiled=False), limits, runs, row_len)
    compiled = _takes(_mixer(streams, shares, unit, compiled=True), limits, runs, row_len)
    assert compiled == python


@needs_compiled
@pytest.mark.parametrize("unit", ["tokens", "documents"])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_ties_go_the_same_way_compiled(unit, n):
    # equal shares, documents of one length: keys tie at almost every take
    streams = [_chunks(d, [[4] * 50, [], [4] * 30], first_token=1 + 1000 * d) for d in range(n)]
    limits = [10**6] * 2000
    for runs, row_len in [(True, 64), (False, 64), (True, None), (False, 3)]:
        python = _takes(_mixer(streams, [1 / n] * n, unit, compiled=False), limits, runs, row_len)
        compiled = _takes(_mixer(streams, [1 / n] * n, unit, compiled=True), limits, runs, row_len)
        assert compiled == python
        assert python[-1] is None  # to the end of a dataset


@needs_compiled
@pytest.mark.parametrize("unit", ["tokens", "documents"])
def test_counts_past_64_bits_are_taken_by_the_python(unit):
    # a state whose counts are past what the compiled take's integers hold: the same pieces, by
    # the Python (its ints do not overflow), and the counts carry on exactly
    streams = [_chunks(d, [[5, 9, 300, 2] * 10] * 2, first_token=1 + 1000 * d) for d in range(2)]
    for used in ([2**62, 2**62 + 7], [3, 2**70]):
        state = MixState([Position(), Position()], used)
        python = _takes(_mixer(streams, [0.3, 0.7], unit, False, state.copy()), [100] * 50, True, 64)
        compiled = _takes(_mixer(streams, [0.3, 0.7], unit, True, state.copy()), [100] * 50, True, 64)
        assert compiled == python
        assert max(compiled[-1][4]["used"]) > 2**62


def _filled(mixer: Mixer, windows: list[int], row_len: int) -> list:
    """The wrap packer's pieces window after window (``windows``: rows in each), as numbers, with
    the state after each window."""
    out = []
    for rows in windows:
        pieces: list = []
        filled = mixer.fill(pieces, 0, rows * row_len, row_len)
        taken = [(p.dataset, p.doc, p.start, p.stop, int(p.docs.tokens[p.start])) for p in pieces]
        out.append((taken, filled))
        out.append(mixer.state.to_json())
    return out


@needs_compiled
@settings(max_examples=100, deadline=None)
@given(
    weights=st.lists(st.floats(0.01, 100), min_size=2, max_size=4),
    unit=st.sampled_from(["tokens", "documents"]),
    seed=st.integers(0, 2**31),
    row_len=st.sampled_from([1, 7, 64, 2049]),
    windows=st.lists(st.integers(1, 12), min_size=1, max_size=12),
)
def test_the_compiled_wrap_fills_rows_with_the_pieces_the_takes_give(weights, unit, seed, row_len, windows):
    streams, shares = _generated(weights, seed, chunks=5, most_docs=49)
    python = _filled(_mixer(streams, shares, unit, compiled=False), windows, row_len)
    compiled = _filled(_mixer(streams, shares, unit, compiled=True), windows, row_len)
    assert compiled == python


@needs_compiled
def test_the_compiled_wrap_hands_counts_past_64_bits_to_the_python():
    streams = [_chunks(d, [[5, 9, 300, 2] * 10] * 2, first_token=1 + 1000 * d) for d in range(2)]
    state = MixState([Position(), Position()], [2**62 - 100, 2**62 - 90])
    python = _filled(_mixer(streams, [0.5, 0.5], "tokens", False, state.copy()), [4, 4, 4], 64)
    compiled = _filled(_mixer(streams, [0.5, 0.5], "tokens", True, state.copy()), [4, 4, 4], 64)
    assert compiled == python
    assert max(compiled[1]["used"]) > 2**62  # one crossed the line inside the first window


@needs_compiled
def test_the_compiled_take_refuses_what_is_not_an_int_and_limits_under_one_token():
    # anything but ints could run Python code while the take holds items borrowed from the lists
    class Index:
        def __index__(self):
            return 0

    lists = lambda docs: ([[0, 2, 4], [0, 3]], docs, [0, 0], [0, 0], [0.5, 0.5], [0, 0])  # noqa: E731
    with pytest.raises(TypeError, match="must be ints"):
        mixture._compiled.take_by_shares(*lists([Index(), 0]), 3, True, True)
    with pytest.raises(ValueError, match="at least 1 token"):
        mixture._compiled.take_by_shares(*lists([0, 0]), 0, True, True)
    assert mixture._compiled.take_by_shares(*lists([0, 0]), 3, True, True) == (0, 0, 0, 2, False)
