"""A disk cache of remote file blocks: atomic, checksummed, shared by a node's processes.

Remote files are read in aligned blocks of ``block_size`` bytes. A block is stored under a key
made of the file's URL, size and version (ETag, blob id), so a changed file never hits a stale
block. Each entry ends with the SHA-256 of its data: a damaged entry (truncated, corrupted) is
detected on read, dropped and fetched again. Entries are written to a temporary file and renamed
into place, so any number of processes may share the folder: readers see whole entries or none.
When the folder outgrows ``max_bytes``, the least recently used entries are deleted (and the
temporary files of writers killed before their rename, once old). The
checksum covers the entry's key too, so an entry copied over another reads as damaged.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable

_DIGEST = 32
# A ``.tmp`` file older than this is a block whose writer died before renaming it into place:
# writing one block takes well under a second, and eviction would otherwise never see it.
ORPHAN_AGE = 600.0


class BlockCache:
    def __init__(self, directory: str, max_bytes: int, block_size: int):
        self.directory, self.max_bytes, self.block_size = directory, max_bytes, block_size
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise OSError(
                f"the block cache folder {directory} cannot be made ({e.strerror}): set io_options "
                '{"cache": {"dir": ...}} to a writable folder'
            ) from e
        self._lock = threading.Lock()
        self._fetching = [threading.Lock() for _ in range(64)]  # one fetch per block per process
        self._written = 0  # bytes written by this process since its last size check
        self.hits = self.misses = self.damaged = 0

    def _path(self, url: str, size: int, version: str, block: int) -> str:
        key = hashlib.sha256(f"{url}\0{size}\0{version}\0{self.block_size}\0{block}".encode()).hexdigest()
        return os.path.join(self.directory, key[:2], key + ".blk")

    def read(
        self, url: str, size: int, version: str, start: int, stop: int, fetch: Callable[[int, int], bytes]
    ) -> bytes:
        """Bytes ``[start, stop)`` of the file; missing blocks come from ``fetch(a, b)``."""
        if start >= stop:
            return b""
        first, last = start // self.block_size, (stop - 1) // self.block_size
        paths = {b: self._path(url, size, version, b) for b in range(first, last + 1)}
        blocks = {b: self._load(p, self._block_len(b, size)) for b, p in paths.items()}
        if any(data is None for data in blocks.values()):
            stripes = sorted({hash(paths[b]) % len(self._fetching) for b, d in blocks.items() if d is None})
            for i in stripes:
                self._fetching[i].acquire()
            try:
                missing = []
                for b in sorted(blocks):
                    if blocks[b] is None:  # another thread may have fetched it meanwhile
                        blocks[b] = self._load(paths[b], self._block_len(b, size), count=False)
                        if blocks[b] is None:
                            missing.append(b)
                self._fetch_runs(missing, blocks, paths, url, size, fetch)
            finally:
                for i in stripes:
                    self._fetching[i].release()
        joined = b"".join(blocks[b] for b in range(first, last + 1))
        offset = start - first * self.block_size
        return joined[offset : offset + stop - start]

    def _fetch_runs(self, missing, blocks, paths, url, size, fetch) -> None:
        for run in _runs(missing):  # one request per run of consecutive missing blocks
            a, z = run[0] * self.block_size, min(size, (run[-1] + 1) * self.block_size)
            data = fetch(a, z)
            if len(data) != z - a:
                raise OSError(f"{url}: asked for bytes [{a}, {z}), got {len(data)} bytes")
            for b in run:
                part = data[(b - run[0]) * self.block_size : (b - run[0] + 1) * self.block_size]
                blocks[b] = part
                self._store(paths[b], part)

    def _block_len(self, block: int, size: int) -> int:
        return min(self.block_size, size - block * self.block_size)

    def _load(self, path: str, length: int, count: bool = True) -> bytes | None:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            self._count(misses=count)
            return None
        data, digest = raw[:-_DIGEST], raw[-_DIGEST:]
        if len(data) != length or _digest(path, data) != digest:
            self._count(misses=count, damaged=True)
            _unlink(path)
            return None
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)  # recently used: evicted last
        self._count(hits=True)
        return data

    def _count(self, hits: bool = False, misses: bool = False, damaged: bool = False) -> None:
        with self._lock:
            self.hits, self.misses, self.damaged = (
                self.hits + hits,
                self.misses + misses,
                self.damaged + damaged,
            )

    def _store(self, path: str, data: bytes) -> None:
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.write(_digest(path, data))
            os.replace(tmp, path)
        except OSError as e:
            _unlink(tmp)  # a full disk: leave no part of a block behind
            raise OSError(
                f"cannot write the block cache in {self.directory} ({e.strerror}): set io_options "
                '{"cache": {"dir": ...}} to a writable folder, or turn the cache off'
            ) from e
        with self._lock:
            self._written += len(data) + _DIGEST
            due = self._written >= max(self.block_size, self.max_bytes // 16)
            if due:
                self._written = 0
        if due:
            self.evict()

    def evict(self) -> None:
        """Delete the least recently used entries until the folder is under ``max_bytes``."""
        with open(os.path.join(self.directory, ".evict.lock"), "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another process is evicting
            entries, orphans = [], time.time() - ORPHAN_AGE
            for e in self._files():
                st = _stat(e)
                if st is None:
                    continue  # gone meanwhile: a reader dropped it as damaged
                if e.name.endswith(".blk"):
                    entries.append((st.st_mtime, st.st_size, e.path))
                elif e.name.endswith(".tmp") and st.st_mtime < orphans:
                    _unlink(e.path)  # its writer died (SIGKILL) before renaming it
            total = sum(size for _, size, _ in entries)
            for _, size, path in sorted(entries):
                if total <= self.max_bytes:
                    break
                _unlink(path)
                total -= size

    def size(self) -> int:
        """Bytes of the entries in the folder."""
        sizes = (_stat(e) for e in self._files() if e.name.endswith(".blk"))
        return sum(st.st_size for st in sizes if st is not None)

    def _files(self):
        """The files of the folder's subfolders (entries, and entries being written)."""
        for sub in os.scandir(self.directory):
            if sub.is_dir():
                yield from os.scandir(sub.path)


def _stat(entry: os.DirEntry) -> os.stat_result | None:
    """The entry's stat, or None if another process deleted it since the folder was listed."""
    try:
        return entry.stat()
    except FileNotFoundError:
        return None


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _runs(blocks: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for b in blocks:
        if runs and runs[-1][-1] == b - 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs


def _digest(path: str, data: bytes) -> bytes:
    """The checksum of an entry: of its key (its file name) and its bytes, so that an entry
    copied over another key reads as damaged."""
    return hashlib.sha256(os.path.basename(path).encode() + b"\0" + data).digest()
