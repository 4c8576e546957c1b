"""pack_flat: documents -> rows of ``max_length + 1`` tokens.

``wrap`` concatenates the lane's documents and cuts the stream into rows, splitting documents at
row edges. ``best_fit`` keeps documents whole (splitting only those longer than a row) and packs
the window's documents into as few rows as it can, best-fit decreasing. Either way the window's
last partial row is padded (sources -1, so its labels become -100), never dropped.

``positions`` restart at 0 at every document start and wherever a document was split (a row
that begins inside a document, a piece of an overlong one), so that attention can be masked per
document and rotary positions stay below the row length.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from zephon.ops.base import Accumulator, Operator
from zephon.ops.containers import PAD_SOURCE, Docs, Rows

ALGORITHMS = ("wrap", "best_fit")


@dataclass(slots=True)
class Segments:
    """A work unit: a token stream (tokens, position in document, source) cut into rows."""

    tokens: np.ndarray
    doc_positions: np.ndarray
    sources: np.ndarray
    row_starts: np.ndarray  # int64 [rows]: where each row starts in the stream
    row_lengths: np.ndarray  # int64 [rows]: tokens of the stream in each row (rest is padding)


class PackFlat(Operator):
    kind = "pack_flat"
    takes = ("docs",)
    gives = "rows"

    def __init__(self, max_length: int, algorithm: str = "wrap", pad_id: int = 0, parallelism=None):
        super().__init__(parallelism)
        if not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"pack_flat(max_length={max_length!r}): must be an int >= 1")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"pack_flat(algorithm={algorithm!r}): expected one of {ALGORITHMS}")
        self.max_length, self.algorithm, self.pad_id = max_length, algorithm, int(pad_id)

    @property
    def row_len(self) -> int:
        return self.max_length + 1  # input_ids = row[:-1], labels = row[1:]

    def params(self) -> dict:
        return {"max_length": self.max_length, "algorithm": self.algorithm, "pad_id": self.pad_id}

    def accumulator(self, lane: int, window: int) -> Accumulator:
        return WrapAccumulator(self.row_len) if self.algorithm == "wrap" else BestFitAccumulator(self.row_len)

    def work(self, unit: Segments) -> Rows:
        n, row_len = len(unit.row_starts), self.row_len
        tokens = np.full((n, row_len), self.pad_id, np.int32)
        positions = np.zeros((n, row_len), np.int32)
        sources = np.full((n, row_len), PAD_SOURCE, np.int16)
        for r in range(n):
            a, k = int(unit.row_starts[r]), int(unit.row_lengths[r])
            tokens[r, :k] = unit.tokens[a : a + k]
            sources[r, :k] = unit.sources[a : a + k]
            pos = unit.doc_positions[a : a + k]
            positions[r, :k] = _restart_at_row_start(pos)
        return Rows(tokens, positions, sources)


def _restart_at_row_start(pos: np.ndarray) -> np.ndarray:
    """A row that begins inside a document counts that document's positions from 0."""
    if len(pos) == 0 or pos[0] == 0:
        return pos
    starts = np.flatnonzero(pos == 0)
    head = len(pos) if len(starts) == 0 else int(starts[0])
    out = pos.copy()
    out[:head] -= pos[0]
    return out


class WrapAccumulator(Accumulator):
    """Holds the tail of the stream that does not fill a row yet."""

    def __init__(self, row_len: int):
        self.row_len = row_len
        self.tail: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def push(self, docs: Docs) -> list[Segments]:
        parts = [(docs.tokens, docs.positions(), docs.token_sources())]
        if self.tail is not None:
            parts.insert(0, self.tail)
        tokens, pos, src = (np.concatenate(x) for x in zip(*parts, strict=True))
        full = len(tokens) // self.row_len * self.row_len
        self.tail = (tokens[full:], pos[full:], src[full:]) if full < len(tokens) else None
        if full == 0:
            return []
        starts = np.arange(0, full, self.row_len, dtype=np.int64)
        return [Segments(tokens[:full], pos[:full], src[:full], starts, np.full_like(starts, self.row_len))]

    def flush(self) -> list[Segments]:
        if self.tail is None:
            return []
        tokens, pos, src = self.tail
        self.tail = None
        return [Segments(tokens, pos, src, np.zeros(1, np.int64), np.array([len(tokens)]))]


class BestFitAccumulator(Accumulator):
    """Collects the window's documents; at the flush, packs them best-fit decreasing."""

    def __init__(self, row_len: int):
        self.row_len = row_len
        self.docs: list[Docs] = []

    def push(self, docs: Docs) -> list[Segments]:
        if len(docs):
            self.docs.append(docs)
        return []

    def flush(self) -> list[Segments]:
        if not self.docs:
            return []
        docs, self.docs = Docs.concat(self.docs), []
        pieces = _pieces(docs.offsets, self.row_len)  # (start, length), none longer than a row
        order = sorted(range(len(pieces)), key=lambda i: (-pieces[i][1], i))
        bins: list[list[int]] = []  # piece indices per row, in creation order
        free: list[tuple[int, int]] = []  # (space left, row) sorted: best fit = first that fits
        for i in order:
            length = pieces[i][1]
            at = bisect.bisect_left(free, (length, -1))
            if at == len(free):
                row, space = len(bins), self.row_len - length
                bins.append([i])
            else:
                space, row = free.pop(at)
                bins[row].append(i)
                space -= length
            if space > 0:
                bisect.insort(free, (space, row))
        return [self._segments(docs, pieces, bins)]

    def _segments(self, docs: Docs, pieces, bins) -> Segments:
        placed = [pieces[i] for row in bins for i in row]
        index = np.concatenate([np.arange(a, a + n) for a, n in placed])
        # a piece cut from a longer document starts its positions at 0 again
        within = np.concatenate([np.arange(n, dtype=np.int32) for _, n in placed])
        lengths = np.array([sum(pieces[i][1] for i in row) for row in bins], np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        return Segments(docs.tokens[index], within, docs.token_sources()[index], starts, lengths)


def _pieces(offsets: np.ndarray, row_len: int) -> list[tuple[int, int]]:
    """Documents as (start, length), a document longer than a row cut into row-sized pieces."""
    pieces = []
    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        for s in range(a, b, row_len):
            pieces.append((s, min(row_len, b - s)))
    return pieces
