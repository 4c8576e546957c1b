"""A chunk's documents laid out by the compiled lay-out (``zephon/ops/_docs.c``) are what the
Python lays out: tokens with BOS and EOS where asked, offsets, and each token's place in its
document; on generated documents, with every combination of special tokens."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.ops import tokenize
from zephon.ops.containers import Docs


def test_the_compiled_lay_out_is_built():
    built = tokenize._lay_out is not None
    assert built, "zephon.ops._docs was not built: pip install -e . needs a C compiler"


# the rest compares the compiled part with its twin: without it, the test above says why
needs_compiled = pytest.mark.skipif(
    tokenize._lay_out is None, reason="zephon.ops._docs not built: see the test above"
)


def _python(ids, lengths, bos, eos):
    tokens, offsets = tokenize._with_special(ids, lengths, bos, eos)
    docs = Docs(tokens, offsets, np.arange(len(lengths)), 0)
    return tokens, offsets, docs.token_positions()


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), min_size=0, max_size=60),
    bos=st.sampled_from([None, 0, 50255]),
    eos=st.sampled_from([None, 0, 50256]),
    seed=st.integers(0, 2**31),
)
def test_compiled_and_python_lay_out_the_same_documents(lengths, bos, eos, seed):
    lengths = np.array(lengths, np.int64)
    ids = np.random.default_rng(seed).integers(0, 2**31 - 1, int(lengths.sum())).astype(np.int32)
    compiled = tokenize._documents(ids, lengths, bos, eos)
    python = _python(ids, lengths, bos, eos)
    for a, b in zip(compiled, python, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


@needs_compiled
def test_by_hand():
    tokens, offsets, places = tokenize._documents(np.array([7, 8, 9], np.int32), np.array([2, 1]), 1, 2)
    assert tokens.tolist() == [1, 7, 8, 2, 1, 9, 2]
    assert offsets.tolist() == [0, 4, 7]
    assert places.tolist() == [0, 1, 2, 3, 0, 1, 2]


@needs_compiled
def test_lengths_that_do_not_add_up_to_the_ids_are_refused():
    lengths = np.array([2, 1])
    out = (np.empty(4, np.int32), np.empty(3, np.int64), np.empty(4, np.int32))
    with pytest.raises(ValueError, match="do not add up"):  # 3 tokens of documents, 4 ids
        tokenize._lay_out(np.arange(4, dtype=np.int32), lengths, -1, -1, *out)
    with pytest.raises(ValueError, match="not sized"):  # 4 tokens out for 3 ids
        tokenize._lay_out(np.arange(3, dtype=np.int32), lengths, -1, -1, *out)


@needs_compiled
def test_lengths_that_overflow_are_refused_before_anything_is_written():
    out = (np.empty(2, np.int32), np.empty(3, np.int64), np.empty(2, np.int32))
    with pytest.raises(ValueError, match="do not add up"):
        tokenize._lay_out(np.arange(2, dtype=np.int32), np.array([1, 2**63 - 1]), -1, -1, *out)
    with pytest.raises(ValueError, match="do not add up"):
        tokenize._lay_out(np.arange(2, dtype=np.int32), np.array([2, -1]), -1, -1, *out)
