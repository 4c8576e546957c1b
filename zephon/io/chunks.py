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


@dataclass(frozen=True, slots=True)
class ChunkTable:
    """All chunks of one dataset, as parallel arrays (a dataset may have millions of chunks)."""

    shard: np.ndarray  # int32
    start: np.ndarray  # int64
    stop: np.ndarray  # int64

    @staticmethod
    def from_ranges(ranges: list[tuple[int, int, int]]) -> ChunkTable:
        arr = np.asarray(ranges, dtype=np.int64).reshape(-1, 3)
        return ChunkTable(arr[:, 0].astype(np.int32), arr[:, 1].copy(), arr[:, 2].copy())

    def __len__(self) -> int:
        return len(self.shard)

    def chunk(self, dataset: int, i: int) -> Chunk:
        return Chunk(dataset, int(self.shard[i]), int(self.start[i]), int(self.stop[i]))

    def sizes(self) -> np.ndarray:
        return self.stop - self.start


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


def split_range(start: int, stop: int, step: int) -> list[tuple[int, int]]:
    """``[start, stop)`` cut into consecutive pieces of at most ``step``."""
    return [(a, min(a + step, stop)) for a in range(start, stop, step)]
