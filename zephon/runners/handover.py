"""Large results from worker processes through shared memory instead of the pool's pipe.

A worker's result (a chunk's tokens, an image chunk's patches: megabytes) is pickled with its
arrays out of band (pickle protocol 5). Where they come to ``SHIP_BYTES`` or more, the worker
puts them in its arena (``zephon.runners.arena``: a ring in ``/dev/shm``, memory, not disk,
that the owner maps too) and the pipe carries only the rest and where they lie; the owner copies
them out and unpickles the result over its copy. Where the arena has no room, they go in a file
of their own in ``/dev/shm``, which the receiving process reads into one buffer and removes:
one copy, where the pipe costs two and a round of system calls and thread switches per 64 KiB
(a tenth of a core, measured, receiving image chunks for two workers).

Such files live only between a worker's write and the receiving read, so ``/dev/shm`` holds at
most the results in flight and the arenas. Space is reserved before writing (a full
``/dev/shm``, e.g. a container's 64 MiB default, is an error the worker sees, not a crash); where
the space or the folder is not there, the result goes through the pipe as before. Files left by
a worker that died, or by an owner process that died (its workers remove them as they exit), or
sent as the owner exited (its pools' manager threads stop reading), are removed by prefix: when
a pool has shut down, and when the owner's interpreter exits (after its pools' workers are
joined). An owner killed by a signal (SIGKILL, or SIGTERM, which skips exit hooks) after its
workers died (a broken pool takes the survivors down with it) leaves its files to the next pool
made on the machine: it removes the files of owners that are gone, once ``ORPHAN_AGE`` old (a
process of another PID namespace sharing ``/dev/shm`` looks gone too, and its results are read
within moments of their writing; its arenas are removed as soon as their owner maps them).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pickle
import time
import uuid

from zephon.runners import arena

SHM = "/dev/shm"
SHIP_BYTES = 64 << 10  # below this the pipe is as quick
_PREFIXES: set[str] = set()  # of this process's pools, not yet cleaned up
ORPHAN_AGE = 600.0  # seconds: a file of a gone owner this old is never going to be read


def prefix(folder: str = SHM) -> str | None:
    """A new prefix for one pool's files in ``folder``, or None where there is no such memory."""
    if not (os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)):
        return None
    remove_orphans(folder)
    name = os.path.join(folder, f"zephon-{os.getpid()}-{uuid.uuid4().hex[:12]}-")
    _PREFIXES.add(name)
    return name


def ship(result, prefix: str | None, ring: arena.Arena | None = None):
    """In a worker: ``result`` as it is, or, where its arrays are large, a small object whose
    unpickling in the receiving process reads them from shared memory: from the worker's arena
    ``ring`` (``zephon.runners.arena``) where there is room in it, else from a file of its own."""
    if prefix is None:
        return result
    buffers: list[pickle.PickleBuffer] = []
    try:
        payload = pickle.dumps(result, protocol=5, buffer_callback=buffers.append)
    except Exception:
        return result  # the pool's own pickling says what is wrong with it
    views = [b.raw() for b in buffers]
    if sum(v.nbytes for v in views) < SHIP_BYTES:
        return result
    places, end = [], 0
    for v in views:
        places.append((end, v.nbytes))
        end += -(-v.nbytes // arena.ALIGN) * arena.ALIGN  # each array on a cache line, as when fresh
    if ring is not None:
        put = ring.put(views, places, end)
        if put is not None:
            return _InArena(ring.path, payload, places, end, *put)
    path = prefix + uuid.uuid4().hex
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        return result
    try:
        try:
            os.posix_fallocate(fd, 0, end)  # no room: an error here, not SIGBUS or ENOSPC later
            for v, (at, n) in zip(views, places, strict=True):
                done = 0
                while done < n:
                    done += os.pwrite(fd, v[done:], at + done)
        finally:
            os.close(fd)
    except OSError:
        _remove(path)
        return result
    return _Shipment(path, payload, places, end)


class _Shipment:
    __slots__ = ("path", "payload", "places", "size")

    def __init__(self, path: str, payload: bytes, places: list[tuple[int, int]], size: int):
        self.path, self.payload, self.places, self.size = path, payload, places, size

    def __reduce__(self):
        return receive, (self.path, self.payload, self.places, self.size)


def receive(path: str, payload: bytes, places: list[tuple[int, int]], size: int):
    """The result a worker shipped: its arrays read from ``path`` (then removed)."""
    view = arena.aligned(size)
    with open(path, "rb", buffering=0) as f:
        os.unlink(path)
        done = 0
        while done < size:
            n = f.readinto(view[done:])
            if not n:
                raise RuntimeError(f"{path}: a worker's result ended early ({done} of {size} bytes)")
            done += n
    return pickle.loads(payload, buffers=[view[at : at + n] for at, n in places])


class _InArena:
    __slots__ = ("args",)

    def __init__(self, *args):  # as from_arena takes them
        self.args = args

    def __reduce__(self):
        return from_arena, self.args


def from_arena(path: str, payload: bytes, places: list[tuple[int, int]], size: int, start: int, read: int):
    """The result a worker put in its arena at ``path``: its arrays copied out of it."""
    view = arena.take(path, start, size, read)
    return pickle.loads(payload, buffers=[view[at : at + n] for at, n in places])


def remove_all(prefix: str | None) -> None:
    """Remove the files left with this prefix (by a worker that died, or never received)."""
    if prefix is not None:
        for path in glob.glob(glob.escape(prefix) + "*"):
            _remove(path)
        _PREFIXES.discard(prefix)
        arena.forget(prefix)


def remove_orphans(folder: str = SHM) -> None:
    """Remove the files in ``folder`` of owner processes that are gone, once ``ORPHAN_AGE`` old."""
    old = time.time() - ORPHAN_AGE
    for path in glob.glob(os.path.join(glob.escape(folder), "zephon-*-*")):
        owner = os.path.basename(path).split("-")[1]
        try:
            stale = os.stat(path).st_mtime < old
        except OSError:
            continue  # received meanwhile
        if stale and owner.isdigit() and not alive(int(owner)):
            _remove(path)


def alive(pid: int) -> bool:
    """Whether process ``pid`` is running (as far as this PID namespace can tell)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


@atexit.register  # runs after threading's exit hooks, where concurrent.futures joins the workers
def _remove_at_exit() -> None:
    for prefix in list(_PREFIXES):
        remove_all(prefix)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):  # gone already
        os.unlink(path)
