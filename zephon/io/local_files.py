"""Local files held open for positional reads: a dataset's chunks read from a few files over and
over, without opening and closing a file for each (``LocalFiles``, ``LocalRanges``; the opener in
``zephon.io.remote`` gives a line format these where it reads a local file)."""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zephon.io.remote import Requests


class LocalFiles:
    """Local files held open for positional reads (``os.pread``), for one dataset: its chunks are
    read from a few files over and over, and opening and closing a file for each chunk cost an
    inline lane about a twelfth of its pace (side by side over small files: 22.1M tokens/s with
    them kept open, 20.2M without).

    At most ``most`` are open for a dataset, and ``process_most`` for all datasets of a process
    (a recipe of many datasets stays far from the limit of open files); the least recently used is
    closed first, or, where a read is using it, when that read is done. Past the process's
    budget a read opens its file and closes it after, as without this. Thread-safe (a positional
    read moves no shared offset); a copy sent to a worker process starts with none open, and a
    process forked with some open reads its own copies of the same descriptors. They are closed
    when the dataset is dropped (a finalizer that only closes descriptors: it never blocks).

    A file replaced on disk while open is still read as it was when opened, the file the run
    listed; one reopened later is read as it is then, as before."""

    most = 16
    process_most = 128

    def __init__(self):
        self.lock, self.held = threading.Lock(), {}  # path -> _Held, the least recently used first
        # not at exit: a daemon thread may still be reading then
        weakref.finalize(self, _close_all, self.held).atexit = False

    def __reduce__(self):
        return LocalFiles, ()

    def take(self, path: str) -> _Held:
        """The open file ``path``, its readers counted one more; ``give`` it back when done."""
        with self.lock:
            held = self.held.pop(path, None)
            if held is not None:
                self.held[path] = held  # the most recently used last
                held.readers += 1
                return held
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        with self.lock:
            held = self.held.get(path)
            if held is not None:  # another reader opened it meanwhile
                os.close(fd)
            elif _budget(+1, self.process_most):
                held = self.held[path] = _Held(fd, kept=True)
                while len(self.held) > self.most:
                    oldest = self.held.pop(next(iter(self.held)))
                    oldest.kept = False
                    if oldest.readers == 0:
                        oldest.close()
            else:  # the process holds its budget of files open: this read's alone
                held = _Held(fd, kept=False)
            held.readers += 1
            return held

    def give(self, held: _Held) -> None:
        with self.lock:
            held.readers -= 1
            if not held.kept and held.readers == 0:
                held.close()


_OPEN, _OPEN_LOCK = [0], threading.Lock()  # descriptors LocalFiles keep in this process


def _budget(change: int, most: int = 0) -> bool:
    """Count ``change`` descriptors kept in the process; an increase only within ``most``."""
    with _OPEN_LOCK:
        if change > 0 and _OPEN[0] + change > most:
            return False
        _OPEN[0] += change
        return True


class _Held:
    """A descriptor ``LocalFiles`` opened: its readers, and whether it is kept (counted in the
    process's budget) or closed when its last reader is done."""

    __slots__ = ("budgeted", "fd", "kept", "readers")

    def __init__(self, fd: int, kept: bool):
        self.fd, self.readers, self.kept, self.budgeted = fd, 0, kept, kept

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        if self.budgeted:
            self.budgeted = False
            _budget(-1)


def _close_all(held: dict) -> None:
    for file in list(held.values()):
        file.close()
    held.clear()


class LocalRanges:
    """Byte ranges of a local file held open by ``LocalFiles``, read by ``os.pread``; each read
    call counts as a request, as ``CountedFile``'s do. ``tail`` as there."""

    tail = 4 << 10

    def __init__(self, files: LocalFiles, path: str, requests: Requests):
        self.files, self.requests, self.pos = files, requests, 0
        self.file = files.take(path)

    def seek(self, pos: int) -> int:
        self.pos = pos
        return pos

    def read(self, n: int = -1) -> bytes:
        fd = self.file.fd
        if n is None or n < 0:
            n = max(0, os.fstat(fd).st_size - self.pos)
        data = os.pread(fd, n, self.pos)
        if 0 < len(data) < n:  # short only at the end, but for a filesystem that splits reads
            parts = [data]
            while (got := sum(map(len, parts))) < n and (more := os.pread(fd, n - got, self.pos + got)):
                parts.append(more)
            data = b"".join(parts)
        self.pos += len(data)
        self.requests.add(1, len(data))
        return data

    def close(self) -> None:
        if self.file is not None:
            self.files.give(self.file)
            self.file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
