"""The thread runner: worker threads, most urgent work first. Tokenizers and Arrow release the GIL.

Its workers are the parallelism: each encodes its own chunk, so Hugging Face ``tokenizers`` is
told not to spread one call over its own thread pool as well (``TOKENIZERS_PARALLELISM=false``,
unless the environment already sets it; the setting is the process's, as ``tokenizers`` reads
it). Nested under two workers on two cores, its pool left a fifth of the CPU idle and made the
throughput benchmark's thread x2 run with that backend about 1.15x slower. Likewise fastokens
(``FASTOKENS_BPE_THREADS=1``, read when it first encodes): with its own threads under two workers
on two cores, the lane thread lost its core to them while holding the GIL (thread x2 0.82x
inline, against 0.88-0.94x with one thread a call, side by side).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from zephon.runners.base import Executor, InlineExecutor, Runner
from zephon.runners.priority import WorkerThreads

log = logging.getLogger(__name__)
_SAID: set[str] = set()  # what holds the GIL, said once a process (every run would repeat it)


class ThreadExecutor(WorkerThreads):
    def __init__(self, work, parallelism: int):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
        super().__init__(work, parallelism)


class ThreadRunner(Runner):
    name = "thread"
    background = True

    def executor(self, work, parallelism: int, timeout: float) -> Executor:
        held = getattr(work, "holds_gil", None)
        if parallelism > 1 and held and held not in _SAID:
            _SAID.add(held)
            log.warning("zephon: %s (%d thread workers here)", held, parallelism)
        return InlineExecutor(work) if parallelism == 0 else ThreadExecutor(work, parallelism)


def planning_map(io) -> Callable:
    """The map planning reads file metadata with: as many threads as the process may have store
    requests in flight (``io.max_requests``), so a plan of many files is bound by the store."""
    return functools.partial(thread_map, workers=io.max_requests)


def thread_map(fn, items, workers: int = 16) -> list:
    """``list(map(fn, items))`` on a thread pool: for I/O-bound planning (file metadata)."""
    items = list(items)
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(workers, len(items)), thread_name_prefix="zephon-plan") as pool:
        return list(pool.map(fn, items))
