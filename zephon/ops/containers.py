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
    """The records of one chunk of dataset ``dataset``; ``numbers``: each one's place among the
    chunk's records (filters and skipped records leave gaps). ``skip_bad``: the dataset skips
    bad records (``on_error="skip"``) instead of raising; ``skipped``: those skipped so far, as
    (place in the chunk, why)."""

    dataset: int
    records: list[dict]
    numbers: np.ndarray  # int64 [n]
    counters: dict[str, int] = field(default_factory=dict)
    skip_bad: bool = False
    skipped: list[tuple[int, str]] = field(default_factory=list)

    def without(self, bad: dict[int, str], counters: dict[str, int] | None = None) -> RecordBlock:
        """This block less the records at positions ``bad`` (position: why), counted as skipped."""
        keep = np.ones(len(self.records), bool)
        keep[list(bad)] = False
        counters = dict(self.counters if counters is None else counters)
        counters["skipped_records"] = counters.get("skipped_records", 0) + len(bad)
        skipped = self.skipped + [(int(self.numbers[i]), why) for i, why in bad.items()]
        records = [r for r, k in zip(self.records, keep, strict=True) if k]
        return RecordBlock(self.dataset, records, self.numbers[keep], counters, self.skip_bad, skipped)

    def __len__(self) -> int:
        return len(self.records)


@dataclass(slots=True)
class Docs:
    """A chunk's documents as one flat token array: document i is ``tokens[offsets[i]:offsets[i+1]]``,
    made of record ``records[i]`` of the chunk; no document is empty. ``counters``: what was left
    out on the way (empty documents, filtered records)."""

    tokens: np.ndarray  # int32 [total]
    offsets: np.ndarray  # int64 [n + 1]
    records: np.ndarray  # int64 [n]
    dataset: int
    counters: dict[str, int] = field(default_factory=dict)
    skipped: list[tuple[int, str]] = field(default_factory=list)  # as RecordBlock's

    def __len__(self) -> int:
        return len(self.offsets) - 1


@dataclass(slots=True)
class Rows:
    """Packed rows of ``row_len`` tokens; ``sources``: each token's dataset, -1 on padding;
    ``starts``: the first token of each document (not where a document continues after a cut)."""

    tokens: np.ndarray  # int32 [n, row_len]
    positions: np.ndarray  # int32 [n, row_len]
    sources: np.ndarray  # int16 [n, row_len]
    starts: np.ndarray  # bool [n, row_len]

    FIELDS = ("tokens", "positions", "sources", "starts")

    def __len__(self) -> int:
        return len(self.tokens)

    def slice(self, start: int, stop: int) -> Rows:
        return Rows(*(getattr(self, f)[start:stop] for f in self.FIELDS))

    def take(self, order: np.ndarray) -> Rows:
        return Rows(*(getattr(self, f)[order] for f in self.FIELDS))

    @staticmethod
    def concat(items: list[Rows]) -> Rows:
        return Rows(*(np.concatenate([getattr(r, f) for r in items]) for f in Rows.FIELDS))

    @staticmethod
    def padding(n: int, row_len: int, pad_id: int) -> Rows:
        return Rows(
            np.full((n, row_len), pad_id, np.int32),
            np.zeros((n, row_len), np.int32),
            np.full((n, row_len), PAD_SOURCE, np.int16),
            np.zeros((n, row_len), bool),
        )


def sum_counters(items: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for counters in items:
        for k, v in counters.items():
            total[k] = total.get(k, 0) + v
    return total
