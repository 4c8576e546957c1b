"""A worker's arena: one shared-memory file, mapped by the worker and by the pool's owner, that
carries the worker's large results as a ring (``zephon.runners.handover`` sends through it first).

A file per result cost its pages each time: the worker's kernel allocated, zeroed and filled
them, the owner's read them into fresh memory and freed them on unlinking (a text unit of 2 MiB:
0.86 ms to ship, 0.61 ms to receive, measured, where copying it is 0.05 ms). The arena's pages
are allocated once, when the worker first ships a large result, and reused: the worker copies a
result's arrays into the ring, the owner copies them out into its own memory as it unpickles the
result, and tells the worker how far it has read with the next unit it sends that worker (the
pipe orders the two: the worker never overwrites what the owner has not copied yet, on any
processor). A result that does not fit in the room left goes through a file of its own, as before.

An arena is 8 times the worker's first large result, 8 MiB to 128 MiB, and at most a quarter of
the room free in ``/dev/shm`` when it is made (each worker's takes a quarter of what the ones
before left); where that is under two such results (a container's 64 MiB ``/dev/shm`` shared by
many workers), the worker uses files, as before. The owner maps a worker's arena when its first
result from there arrives, and removes the file at once (both keep their mappings); a file left by
a worker killed before that goes with its pool's files (``handover.remove_all``).
"""

from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np

ALIGN = 64  # each result and array starts on a cache line
SMALLEST, LARGEST = 8 << 20, 128 << 20  # bytes of an arena
RESULTS = 8  # an arena holds this many results the size of the first one (units in flight and queued)
SHARE = 4  # an arena takes at most this part of the room free in /dev/shm: the other workers', and files


class Arena:
    """The worker's side: ``path`` is made on the first ``put``, its size fixed by that result."""

    def __init__(self, path: str):
        self.path = path
        self.ring: memoryview | None = None  # the mapping
        self.size = 0  # 0: not made yet; -1: could not be made (no room): never again
        self.written = 0  # bytes put in so far, gaps at the ring's end included
        self.read = 0  # of those, what the owner has said it copied out (``heard``)

    def heard(self, read: int) -> None:
        """The owner copied out everything put before byte ``read`` (said with a unit)."""
        self.read = max(self.read, read)

    def put(self, views: list[memoryview], places: list[tuple[int, int]], need: int) -> tuple | None:
        """Copy ``views`` into the ring at ``places`` past a start: (that start, the byte count
        once they are read), or None where they do not fit in the room left."""
        if self.size == 0:
            self._make(need)
        if self.size <= 0:
            return None
        start = self.written % self.size
        gap = self.size - start if start + need > self.size else 0  # to the ring's end: skipped
        if self.written + gap + need - self.read > self.size:
            return None  # the owner has not read that far yet (or larger than the ring)
        start = 0 if gap else start
        for v, (at, _) in zip(views, places, strict=True):
            _write(self.ring, start + at, v)
        self.written += gap + need
        return start, self.written

    def _make(self, first: int) -> None:
        size = min(LARGEST, max(SMALLEST, RESULTS * first), _free(os.path.dirname(self.path)) // SHARE)
        size -= size % mmap.PAGESIZE
        if size < 2 * first:  # a small /dev/shm (a container's 64 MiB): left to the files, as before
            self.size = -1
            return
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except OSError:
            self.size = -1
            return
        try:
            os.posix_fallocate(fd, 0, size)  # no room: known here, not as SIGBUS on a write
            self.ring = memoryview(mmap.mmap(fd, size))
            self.size = size
        except OSError:
            self.size = -1
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        finally:
            os.close(fd)


def _free(folder: str) -> int:
    """Bytes free in ``folder``'s file system (0 where it cannot tell)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _write(ring: memoryview, at: int, data: memoryview) -> None:
    ring[at : at + len(data)] = data


# Copies in and out are memoryview assignments, which hold the GIL, not numpy's, which let it go
# for large arrays: the owner copies on its receiving thread, a daemon, and a daemon thread that
# asks for the GIL back during the interpreter's exit is ended where it stands; inside numpy's
# copy loop that aborted the process ("FATAL: exception not rethrown": the README's image example,
# closing its pipeline with results in flight, one exit in three).

# the owner's side: the arenas of its workers it has mapped, and how far it has read each
_MAPPED: dict[str, memoryview] = {}
_READ: dict[str, int] = {}


def take(path: str, start: int, size: int, read: int) -> memoryview:
    """In the owner: bytes ``[start, start + size)`` of the arena at ``path``, copied out into
    memory of this process (aligned to ``ALIGN``); ``read``: the worker's count once they are."""
    ring = _MAPPED.get(path)
    if ring is None:
        ring = _MAPPED[path] = _attach(path)
    out = aligned(size)
    out[:] = ring[start : start + size]
    _READ[path] = max(_READ.get(path, 0), read)
    return out


def aligned(size: int) -> memoryview:
    """``size`` bytes of fresh memory of this process, starting on a cache line."""
    data = np.empty(size + ALIGN, np.uint8)
    return memoryview(data[-data.ctypes.data % ALIGN :][:size])


def read_of(path: str | None) -> int:
    """How far the owner has read the arena at ``path`` (0 before its first result)."""
    return _READ.get(path, 0) if path is not None else 0


def _attach(path: str) -> memoryview:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as e:
        raise RuntimeError(f"{path}: a worker's arena of results is gone ({e})") from None
    try:
        ring = memoryview(mmap.mmap(fd, 0))
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(path)  # both ends have it mapped: nothing to leave behind
    return ring


def forget(prefix: str) -> None:
    """In the owner: unmap the arenas of a pool (paths under ``prefix``) once its workers ended."""
    for path in [p for p in list(_MAPPED) if p.startswith(prefix)]:  # a copy: another thread may add one
        _MAPPED.pop(path, None)  # the pool's shutdown and the exit hook may both be here at once
        _READ.pop(path, None)
