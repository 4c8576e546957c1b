"""The interface every file format implements."""

from __future__ import annotations

import hashlib
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import xxhash

from zephon.io.chunks import Group, Shard

Records = list[dict[str, Any]]


class DataError(ValueError):
    """Malformed data: the message names the file and the place in it."""


@dataclass(slots=True)
class ChunkRead:
    """The records of a chunk, and the digest of the bytes they were read from (see
    ``content_digest``): the same bytes always give the same digest, however they were read."""

    records: Records
    digest: str


# what identifies a chunk's bytes: XXH3-64, a tenth of SHA-256's time here (0.05 ms per MB); the
# states of runs before it hold SHA-256 digests, which a restore checks as such (zephon.digests)
DIGESTS = {"xxh3": xxhash.xxh3_64, "sha256": hashlib.sha256}


def content_digest(*parts, algorithm: str = "xxh3") -> str:
    """A chunk's identity, checked every time the run reads the chunk again: the digest of
    ``parts`` (bytes-like), each with its length, by ``algorithm``; ``"xxh3:"`` and 16 hex
    digits, or for ``"sha256"`` its first 16 hex digits alone (as states saved before XXH3 hold
    them, and as a file's ``content:`` version has them)."""
    digest = DIGESTS[algorithm]()
    for part in parts:
        view = memoryview(part)
        digest.update(view.nbytes.to_bytes(8, "little"))
        digest.update(view)
    value = digest.hexdigest()[:16]
    return value if algorithm == "sha256" else f"{algorithm}:{value}"


class BadRecord:
    """In place of a record that cannot be read, where bad records are skipped: why."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message


class Format(ABC):
    """Plans one shard into chunk ranges and reads a chunk into records.

    ``unit`` says what chunk ranges count: ``"rows"`` or ``"bytes"``.
    """

    name: str
    unit: str

    def __init__(self, compression: str | None = None):
        self.compression = compression

    @abstractmethod
    def groups(self, shard: Shard, opener) -> list[Group]:
        """What chunking needs of ``shard``, from its metadata: its groups ``(start, stop,
        bytes)`` in this format's unit (a Parquet row group, an Arrow record batch, a tar's
        samples: rows; a line file: its bytes), each cut into chunks by
        ``zephon.io.chunks.chunk_table``."""

    def schema_names(self, shard: Shard, opener) -> list[str] | None:
        """The field names of ``shard`` from its metadata, or None if it has no schema."""
        return None

    @abstractmethod
    def read(
        self,
        shard: Shard,
        start: int,
        stop: int,
        columns: tuple[str, ...] | None,
        opener,
        skip_bad: bool = False,
        digest: str = "xxh3",
    ) -> ChunkRead:
        """The records of ``[start, stop)`` of ``shard`` and the digest of the bytes they come
        from (``content_digest`` by ``digest``); ``opener`` (a zephon.io.remote.Opener) opens
        files, local or remote. A record that cannot be read raises a DataError, or with
        ``skip_bad`` is a ``BadRecord`` in the list (row formats have no such records)."""

    def __repr__(self) -> str:
        return f"{self.name}" + (f"+{self.compression}" if self.compression else "")


class LRU:
    """A tiny thread-safe LRU map; one per process, for footers and decoded row groups. At most
    ``capacity`` items and, where ``weigh`` says what an item holds, ``max_bytes`` in all (the
    last item put always stays)."""

    def __init__(self, capacity: int, max_bytes: int | None = None, weigh=None):
        self.capacity, self.items, self.lock = capacity, OrderedDict(), threading.Lock()
        self.max_bytes, self.weigh, self.bytes = max_bytes, weigh, 0

    def get(self, key):
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key][0]
        return None

    def clear(self) -> None:
        with self.lock:
            self.items.clear()
            self.bytes = 0

    def put(self, key, value):
        weight = self.weigh(value) if self.weigh else 0
        with self.lock:
            old = self.items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self.items[key] = (value, weight)
            self.bytes += weight
            while len(self.items) > 1 and (
                len(self.items) > self.capacity or (self.max_bytes and self.bytes > self.max_bytes)
            ):
                self.bytes -= self.items.popitem(last=False)[1][1]
