"""Closing what nobody holds any more, without blocking the thread that let go of it.

A run that is dropped while its background work goes on (its lanes' thread, a worker pool) must
stop that work, but not in its finalizer: a finalizer runs wherever the garbage collector happens
to run, possibly inside ``concurrent.futures`` while it holds the locks that shutting a pool down
takes, and waiting there deadlocks (it once held CI for 17 minutes). So a finalizer only hands its
closer to this module's queue, whose ``put`` is reentrant (safe in finalizers), and one daemon
thread, started beforehand in ordinary code, calls it.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from collections.abc import Callable

log = logging.getLogger(__name__)

_QUEUE: queue.SimpleQueue = queue.SimpleQueue()
_STARTED = threading.Lock()
_thread: threading.Thread | None = None


def close_when_dropped(owner: object, close: Callable[[], None]) -> weakref.finalize:
    """Once ``owner`` is garbage, ``close()`` runs on the reaper thread (``close`` must not hold
    ``owner``). Returns the finalizer: ``detach()`` it when ``close`` was called otherwise."""
    _start()
    finalizer = weakref.finalize(owner, _QUEUE.put, close)
    finalizer.atexit = False  # at exit the worker pools' own exit hooks end their workers
    return finalizer


def _start() -> None:
    global _thread
    with _STARTED:
        if _thread is None:
            _thread = threading.Thread(target=_reap, name="zephon-reaper", daemon=True)
            _thread.start()


def _reap() -> None:
    while True:
        close = _QUEUE.get()
        try:
            close()
        except Exception:  # nothing to report it to: the owner is gone
            log.exception("zephon: closing a dropped run failed")
