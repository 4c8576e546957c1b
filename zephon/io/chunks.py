"""Shards and chunks: the units a dataset is planned and read in.

A *shard* is one file of a dataset. A *chunk* is a contiguous range of one shard: rows for
row-addressable formats (Parquet, Arrow IPC), bytes for line formats (JSON lines, text), where a
chunk owns the lines that *start* inside its byte range. Chunks are planned from metadata alone
(file sizes, row-group and record-batch row counts); reading one is stateless work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Shard:
    """One file of a dataset: its URL (or local path), size in bytes, and version (ETag, blob
    id, commit: whatever the store reports, "" if nothing), which keys the block cache."""

    url: str
    size: int
    version: str = ""


class FileTable(Sequence[Shard]):
    """The files of a dataset as columns (names under a common root, sizes, versions), a
    sequence of :class:`Shard`: about 100 bytes a file where a list of shards takes 300, for the
    million-file datasets of a job plan (``zephon.jobplan``)."""

    __slots__ = ("name_offsets", "names", "root", "sizes", "version_offsets", "versions")

    def __init__(self, root: str, names: np.ndarray, name_offsets: np.ndarray, sizes: np.ndarray,
                 versions: np.ndarray, version_offsets: np.ndarray):  # fmt: skip
        self.root, self.names, self.name_offsets, self.sizes = root, names, name_offsets, sizes
        self.versions, self.version_offsets = versions, version_offsets

    @staticmethod
    def of(shards: Sequence[Shard]) -> FileTable:
        if isinstance(shards, FileTable):
            return shards
        root = common_root([s.url for s in shards])
        names, name_offsets = _blob([s.url[len(root) :] for s in shards])
        versions, version_offsets = _blob([s.version for s in shards])
        sizes = np.asarray([s.size for s in shards], np.int64)
        return FileTable(root, names, name_offsets, sizes, versions, version_offsets)

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        name = bytes(self.names[self.name_offsets[i] : self.name_offsets[i + 1]]).decode()
        version = bytes(self.versions[self.version_offsets[i] : self.version_offsets[i + 1]]).decode()
        return Shard(self.root + name, int(self.sizes[i]), version)

    def __add__(self, other):
        return list(self) + list(other)

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "names": self.names, "name_offsets": self.name_offsets, "sizes": self.sizes,
            "versions": self.versions, "version_offsets": self.version_offsets,
        }  # fmt: skip


def _blob(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 texts as one byte array and their offsets."""
    encoded = [t.encode() for t in texts]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), np.uint8).copy(), offsets


def common_root(urls: list[str]) -> str:
    """The longest folder (ending in "/") every URL starts with, or "": names are relative to it."""
    if not urls:
        return ""
    low, high = min(urls), max(urls)  # the common prefix of all is that of the extreme two
    n = 0
    while n < min(len(low), len(high)) and low[n] == high[n]:
        n += 1
    return low[: low.rfind("/", 0, n) + 1] if "/" in low[:n] else ""


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


Group = tuple[int, int, int]  # (start, stop, bytes): a file's piece as its metadata tells (zephon.io.formats)


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


def chunk_table(unit: str, groups: list[list[Group]], num_lanes: int, chunk_size: int | None,
                chunk_bytes: int | None) -> ChunkTable:  # fmt: skip
    """A dataset's chunks from its files' groups (``groups[i]``: file ``i``'s), in the format's
    ``unit``: rows (at most ``chunk_size`` a chunk and about ``chunk_bytes``) or bytes (about
    ``chunk_bytes``); either unset is chosen from the dataset's size and ``num_lanes``. A pure
    function: every process that has the groups makes the same table."""
    if unit == "rows":
        size = chunk_size or auto_chunk_rows(sum(b - a for file in groups for a, b, _ in file), num_lanes)
        step = chunk_bytes or MAX_CHUNK_BYTES
        spans = [
            (i, a, b, rows_within(size, step, b - a, n)) for i, file in enumerate(groups) for a, b, n in file
        ]
    else:
        step = chunk_bytes or auto_chunk_bytes(sum(n for file in groups for _, _, n in file), num_lanes)
        spans = [(i, a, b, step) for i, file in enumerate(groups) for a, b, _ in file]
    return ChunkTable.from_spans(spans)
