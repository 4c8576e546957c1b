"""The data that flows through a lane, as numpy arrays, never Python lists of tokens:
``RecordBlock`` (the records of one chunk) -> ``Docs`` (its documents as one flat token array)
-> ``Rows`` (packed rows of a window).
"""

from __future__ import annotations

from collections.abc import Iterable
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
    """A chunk's documents as one flat token array: document i is ``tokens[offsets[i]:offsets[i+1]]``;
    no document is empty. ``counters``: what was left out on the way (empty documents, filtered
    records)."""

    tokens: np.ndarray  # int32 [total]
    offsets: np.ndarray  # int64 [n + 1]
    dataset: int
    counters: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.offsets) - 1


@dataclass(slots=True)
class Rows:
    """Packed rows of ``row_len`` tokens; ``sources``: each token's dataset, -1 on padding."""

    tokens: np.ndarray  # int32 [n, row_len]
    positions: np.ndarray  # int32 [n, row_len]
    sources: np.ndarray  # int16 [n, row_len]

    def __len__(self) -> int:
        return len(self.tokens)

    def slice(self, start: int, stop: int) -> Rows:
        return Rows(self.tokens[start:stop], self.positions[start:stop], self.sources[start:stop])

    def take(self, order: np.ndarray) -> Rows:
        return Rows(self.tokens[order], self.positions[order], self.sources[order])

    @staticmethod
    def concat(items: list[Rows]) -> Rows:
        return Rows(
            np.concatenate([r.tokens for r in items]),
            np.concatenate([r.positions for r in items]),
            np.concatenate([r.sources for r in items]),
        )

    @staticmethod
    def padding(n: int, row_len: int, pad_id: int) -> Rows:
        return Rows(
            np.full((n, row_len), pad_id, np.int32),
            np.zeros((n, row_len), np.int32),
            np.full((n, row_len), PAD_SOURCE, np.int16),
        )


def sum_counters(items: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for counters in items:
        for k, v in counters.items():
            total[k] = total.get(k, 0) + v
    return total
