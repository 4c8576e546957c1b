"""The data that flows between operators, one container per unit of work.

Token data is kept in numpy arrays, never Python lists: ``RecordBlock`` (records of one chunk)
-> ``Docs`` (a chunk's documents as one flat token array) -> ``Rows`` (packed rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PAD_SOURCE = -1  # the `sources` value of padding tokens


@dataclass(slots=True)
class RecordBlock:
    """The records of one chunk of dataset ``dataset``."""

    dataset: int
    records: list[dict]
    counters: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.records)


@dataclass(slots=True)
class Docs:
    """Documents as one flat token array: document i is ``tokens[offsets[i]:offsets[i+1]]``."""

    tokens: np.ndarray  # int32 [total]
    offsets: np.ndarray  # int64 [n + 1]
    sources: np.ndarray  # int16 [n]: dataset index of each document
    counters: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def positions(self) -> np.ndarray:
        """Position of every token inside its document."""
        lengths = self.lengths()
        return (np.arange(len(self.tokens)) - np.repeat(self.offsets[:-1], lengths)).astype(np.int32)

    def token_sources(self) -> np.ndarray:
        return np.repeat(self.sources, self.lengths())

    def select(self, indices: list[int]) -> Docs:
        parts = [self.tokens[self.offsets[i] : self.offsets[i + 1]] for i in indices]
        lengths = np.array([len(p) for p in parts], dtype=np.int64)
        return Docs(
            np.concatenate(parts) if parts else np.zeros(0, np.int32),
            np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            self.sources[indices] if indices else np.zeros(0, np.int16),
        )

    @staticmethod
    def concat(items: list[Docs]) -> Docs:
        if not items:
            return Docs(np.zeros(0, np.int32), np.zeros(1, np.int64), np.zeros(0, np.int16))
        offsets, base = [np.zeros(1, np.int64)], 0
        for d in items:
            offsets.append(d.offsets[1:] + base)
            base += int(d.offsets[-1])
        return Docs(
            np.concatenate([d.tokens for d in items]),
            np.concatenate(offsets),
            np.concatenate([d.sources for d in items]),
            sum_counters(d.counters for d in items),
        )


@dataclass(slots=True)
class Rows:
    """Packed rows of ``row_len`` tokens; ``sources``: each token's dataset, -1 on padding."""

    tokens: np.ndarray  # int32 [n, row_len]
    positions: np.ndarray  # int32 [n, row_len]
    sources: np.ndarray  # int16 [n, row_len]
    counters: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)

    def select(self, indices: list[int]) -> Rows:
        return Rows(self.tokens[indices], self.positions[indices], self.sources[indices])

    @staticmethod
    def concat(items: list[Rows]) -> Rows:
        return Rows(
            np.concatenate([r.tokens for r in items]),
            np.concatenate([r.positions for r in items]),
            np.concatenate([r.sources for r in items]),
            sum_counters(r.counters for r in items),
        )

    @staticmethod
    def padding(n: int, row_len: int, pad_id: int) -> Rows:
        return Rows(
            np.full((n, row_len), pad_id, np.int32),
            np.zeros((n, row_len), np.int32),
            np.full((n, row_len), PAD_SOURCE, np.int16),
        )


def sum_counters(items) -> dict[str, int]:
    total: dict[str, int] = {}
    for counters in items:
        for k, v in counters.items():
            total[k] = total.get(k, 0) + v
    return total


def gather(refs: list[tuple[object, int]]):
    """One container from ``(container, index)`` references, in order, counters merged once."""
    groups: list[tuple[object, list[int]]] = []
    for container, i in refs:
        if groups and groups[-1][0] is container:
            groups[-1][1].append(i)
        else:
            groups.append((container, [i]))
    parts = [c.select(ix) for c, ix in groups]
    return type(parts[0]).concat(parts)
