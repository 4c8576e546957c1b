"""Shards and chunks: the units a dataset is planned and read in.

A *shard* is one file of a dataset. A *chunk* is a contiguous range of one shard: rows for
row-addressable formats (Parquet, Arrow IPC), bytes for line formats (JSON lines, text), where a
chunk owns the lines that *start* inside its byte range. Chunks are planned from metadata alone
(file sizes, row-group and record-batch row counts); reading one is stateless work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Shard:
    """One file of a dataset: its URL (or local path), size in bytes, and version (ETag, blob
    id, commit: whatever the store reports, "" if nothing), which keys the block cache."""

    url: str
    size: int
    version: str = ""


@dataclass(frozen=True, slots=True)
class Chunk:
    """A range ``[start, stop)`` of one shard of one dataset, in the format's unit; ``skip``:
    records of it to leave out at its start (a lane resuming inside the chunk)."""

    dataset: int
    shard: int
    start: int
    stop: int
    skip: int = 0

    @property
    def size(self) -> int:
        return self.stop - self.start


Span = tuple[int, int, int]  # (start, stop, step): [start, stop) cut into chunks of step (the last shorter)


@dataclass(frozen=True, slots=True)
class ChunkTable:
    """All chunks of one dataset, as spans: span ``j`` is ``[start[j], stop[j])`` of shard
    ``shard[j]`` (a file of a line format, a row group, a record batch) cut into chunks of
    ``step[j]``, the last one shorter. Chunk ``i`` is found through the running count of chunks
    per span, so memory goes with the spans (files, row groups), not the chunks: a dataset may
    have hundreds of millions of chunks."""

    span_shard: np.ndarray  # int32 [S]
    span_start: np.ndarray  # int64 [S]
    span_stop: np.ndarray  # int64 [S]
    span_step: np.ndarray  # int64 [S]
    first: np.ndarray  # int64 [S + 1]: chunks before each span

    @staticmethod
    def from_spans(spans: list[tuple[int, int, int, int]]) -> ChunkTable:
        """From ``(shard, start, stop, step)`` per span; empty spans are left out."""
        arr = np.asarray(spans, dtype=np.int64).reshape(-1, 4)
        return ChunkTable.of(arr[:, 0].astype(np.int32), arr[:, 1], arr[:, 2], arr[:, 3])

    @staticmethod
    def of(shard: np.ndarray, start: np.ndarray, stop: np.ndarray, step: np.ndarray) -> ChunkTable:
        keep = stop > start
        shard, start, stop, step = shard[keep], start[keep], stop[keep], step[keep]
        first = np.zeros(len(start) + 1, np.int64)
        np.cumsum(-(-(stop - start) // step), out=first[1:])
        return ChunkTable(shard.astype(np.int32), start.astype(np.int64), stop.astype(np.int64),
                          step.astype(np.int64), first)  # fmt: skip

    def __len__(self) -> int:
        return int(self.first[-1])

    def chunk(self, dataset: int, i: int) -> Chunk:
        j = int(np.searchsorted(self.first, i, side="right")) - 1
        start = int(self.span_start[j]) + (i - int(self.first[j])) * int(self.span_step[j])
        return Chunk(
            dataset,
            int(self.span_shard[j]),
            start,
            min(start + int(self.span_step[j]), int(self.span_stop[j])),
        )

    def ranges(self) -> np.ndarray:
        """Every chunk as ``(shard, start, stop)``: int64 [len, 3] (for small tables: tests, tools)."""
        counts = np.diff(self.first)
        span = np.repeat(np.arange(len(counts)), counts)
        start = self.span_start[span] + (np.arange(len(self)) - self.first[span]) * self.span_step[span]
        stop = np.minimum(start + self.span_step[span], self.span_stop[span])
        return np.stack([self.span_shard[span].astype(np.int64), start, stop], axis=1)

    @property
    def shard(self) -> np.ndarray:
        return self.ranges()[:, 0]

    @property
    def start(self) -> np.ndarray:
        return self.ranges()[:, 1]

    @property
    def stop(self) -> np.ndarray:
        return self.ranges()[:, 2]


# Chunking chosen from a dataset's size and the lane count, unless chunk_size/chunk_bytes are given:
# about CHUNKS_PER_LANE chunks per lane per epoch, so that every lane gets data and the lanes get
# nearly equal shares, but no chunk over MAX_CHUNK_BYTES (bytes of a line format, or uncompressed
# bytes of a row format, as its metadata tells) or MAX_CHUNK_ROWS rows.
CHUNKS_PER_LANE = 8
MIN_CHUNK_BYTES = 16 << 10
MAX_CHUNK_BYTES = 1 << 20
MAX_CHUNK_ROWS = 1024


def auto_chunk_bytes(total_bytes: int, num_lanes: int) -> int:
    """Bytes per chunk of a line format dataset of ``total_bytes``."""
    size = min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, total_bytes // (CHUNKS_PER_LANE * num_lanes)))
    if -(-total_bytes // size) < num_lanes:  # small data: at least one chunk per lane
        size = max(1, total_bytes // num_lanes)
    return size


def auto_chunk_rows(total_rows: int, num_lanes: int) -> int:
    """Rows per chunk of a row format dataset of ``total_rows``."""
    return max(1, min(MAX_CHUNK_ROWS, total_rows // (CHUNKS_PER_LANE * num_lanes)))


def rows_within(chunk_rows: int, chunk_bytes: int, group_rows: int, group_bytes: int) -> int:
    """Rows per chunk inside a row group of ``group_rows`` rows and ``group_bytes`` bytes."""
    per_row = group_bytes / max(1, group_rows)
    return max(1, min(chunk_rows, int(chunk_bytes // per_row) if per_row else chunk_rows))
