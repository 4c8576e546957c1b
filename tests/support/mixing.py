"""Tokenized chunks for the mixer's tests (test_mixer, test_mixer_native)."""

from __future__ import annotations

import numpy as np

from zephon.ops.containers import Docs


def chunks(dataset: int, chunks: list[list[int]], first_token: int = 1) -> list[Docs]:
    """Tokenized chunks with documents of the given lengths (document i from record 2i: odd
    records were filtered out); tokens count up from first_token."""
    out, token = [], first_token
    for lengths in chunks:
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = np.arange(token, token + int(offsets[-1]), dtype=np.int32)
        token += int(offsets[-1])
        records = np.arange(len(lengths), dtype=np.int64) * 2
        out.append(Docs(tokens, offsets, records, dataset, {"empty_documents": 1} if not lengths else {}))
    return out


def from_record(docs: Docs, skip: int) -> Docs:
    """What the workers make of a chunk read from record ``skip`` on."""
    first = int(np.searchsorted(docs.records, skip))
    offsets = docs.offsets[first:] - docs.offsets[first]
    tokens = docs.tokens[docs.offsets[first] :]
    return Docs(tokens, offsets, docs.records[first:], docs.dataset, {} if skip else docs.counters)
