"""Local files held open for positional reads: a dataset's chunks read from a few files over and
over, without opening and closing a file for each (``LocalFiles``, ``LocalRanges``; the opener in
``zephon.io.remote`` gives a line format these where it reads a local file)."""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import stat
import threading
import weakref


class LocalFiles:
    """Local files held open for positional reads (``os.pread``), for one dataset: its chunks are
    read from a few files over and over, and opening and closing a file for each chunk cost an
    inline lane about a twelfth of its pace (side by side over small files: 22.1M tokens/s with
    them kept open, 20.2M without).

    At most ``most`` are open for a dataset, and ``process_most`` for all datasets of a process
    (a recipe of many datasets stays far from the limit of open files); the least recently used is
    closed first, or, where a read is using it, when that read is done. Past the process's
    budget a read opens its file and closes it after, as without this. Thread-safe (a positional
    read moves no shared offset); a copy sent to a worker process starts with none open, and so
    does a process forked from this one (its copies of the descriptors are closed in it). They are
    closed when the dataset is dropped (a finalizer that only closes descriptors: it takes no
    lock and never blocks).

    A file replaced on disk while open is still read as it was when opened, the file the run
    listed; one reopened later (after others pushed it out) is read as it is then, as a file
    opened for each chunk was. A change the run reads is caught by the chunks' content digests."""

    most = 16
    process_most = 128

    def __init__(self):
        self.lock, self.held = threading.Lock(), {}  # path -> _Held, the least recently used first
        # not at exit: a daemon thread may still be reading then
        weakref.finalize(self, _close_all, self.held).atexit = False
        _LIVE.add(self)

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
        fd = _open(path)
        with self.lock:
            held = self.held.get(path)
            if held is not None:  # another reader opened it meanwhile
                os.close(fd)
            elif _budget(+1, self.process_most):
                held = self.held[path] = _Held(fd, path, kept=True)
                while len(self.held) > max(1, self.most):  # never the one just opened
                    oldest = self.held.pop(next(iter(self.held)))
                    oldest.kept = False
                    if oldest.readers == 0:
                        oldest.close()
            else:  # the process holds its budget of files open: this read's alone
                held = _Held(fd, path, kept=False)
            held.readers += 1
            return held

    def give(self, held: _Held) -> None:
        with self.lock:
            held.readers -= 1
            if not held.kept and held.readers == 0:
                held.close()


def _open(path: str) -> int:
    """A descriptor of the regular file ``path``; what ``open`` raises where it is not one."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    return fd


# descriptors LocalFiles keep in this process; those a finalizer closed, counted back by the next
# change (a finalizer takes no lock: it may run in a thread that holds this one)
_OPEN, _OPEN_LOCK, _FREED = [0], threading.Lock(), collections.deque()
_LIVE: weakref.WeakSet = weakref.WeakSet()  # every LocalFiles, for a forked child to empty


def _budget(change: int, most: int = 0) -> bool:
    """Count ``change`` descriptors kept in the process; an increase only within ``most``."""
    with _OPEN_LOCK:
        while _FREED:
            _OPEN[0] -= _FREED.popleft()
        if change > 0 and _OPEN[0] + change > most:
            return False
        _OPEN[0] += change
        return True


def _after_fork() -> None:
    """In a forked child: nothing kept open, no lock held by a thread that is not there."""
    global _OPEN_LOCK
    _OPEN_LOCK, _OPEN[0] = threading.Lock(), 0
    _FREED.clear()
    for files in list(_LIVE):
        files.lock = threading.Lock()
        for held in files.held.values():
            held.budgeted = False
            held.close()
        files.held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class _Held:
    """A descriptor ``LocalFiles`` opened: its readers, and whether it is kept (counted in the
    process's budget) or closed when its last reader is done."""

    __slots__ = ("budgeted", "fd", "kept", "path", "readers")

    def __init__(self, fd: int, path: str, kept: bool):
        self.fd, self.path, self.readers, self.kept, self.budgeted = fd, path, 0, kept, kept

    def close(self, finalizing: bool = False) -> None:
        """Closed once (a second call does nothing: its number may be another file's by then)."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1
        if self.budgeted:
            self.budgeted = False
            if finalizing:
                _FREED.append(1)
            else:
                _budget(-1)


def _close_all(held: dict) -> None:
    for file in list(held.values()):
        file.close(finalizing=True)
    held.clear()


class LocalRanges:
    """Byte ranges of a local file held open by ``LocalFiles``, read by ``os.pread``; each read
    call counts as a request (``requests``: a ``zephon.io.remote.Requests``), as
    ``CountedFile``'s do. ``tail`` as there. Use it in a ``with`` block: closing it gives the file
    back."""

    tail = 4 << 10

    def __init__(self, files: LocalFiles, path: str, requests):
        self.files, self.requests, self.pos = files, requests, 0
        self.file = files.take(path)

    def seek(self, pos: int) -> int:
        self.pos = pos
        return pos

    def read(self, n: int = -1) -> bytes:
        try:
            data = self._read(self.file.fd, n)
        except OSError as e:  # named, as open's errors are
            raise type(e)(e.errno, e.strerror, self.file.path) from None
        self.pos += len(data)
        self.requests.add(1, len(data))
        return data

    def _read(self, fd: int, n: int) -> bytes:
        if n is None or n < 0:
            n = max(0, os.fstat(fd).st_size - self.pos)
        data = os.pread(fd, n, self.pos)
        if 0 < len(data) < n:  # short only at the end, but for a filesystem that splits reads
            parts, got = [data], len(data)
            while got < n and (more := os.pread(fd, n - got, self.pos + got)):
                parts.append(more)
                got += len(more)
            data = b"".join(parts)
        return data

    def close(self) -> None:
        if self.file is not None:
            self.files.give(self.file)
            self.file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
