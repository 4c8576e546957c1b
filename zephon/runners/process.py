"""The process runner: a process pool per operator, for work that holds the GIL.

Each worker process receives the work function once, when it starts (not once per unit), so
heavy state such as a tokenizer is loaded once per worker. Workers are started with
``forkserver`` (``spawn`` where unavailable): forking a process that runs threads is unsafe.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
from concurrent.futures import ProcessPoolExecutor

from zephon.runners.base import Executor, InlineExecutor, Runner
from zephon.runners.priority import PriorityGate

_WORK = None  # the work function of this worker process


def _install(payload: bytes) -> None:
    global _WORK
    # one thread per worker in the tokenizers' own pools: the runner's parallelism is the knob
    for name in ("FASTOKENS_BPE_THREADS", "RAYON_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    _WORK = pickle.loads(payload)


def _run(unit):
    return _WORK(unit)


def check_picklable(work) -> bytes:
    try:
        return pickle.dumps(work)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise ValueError(
            "runner='process' sends operators to worker processes, and one of them cannot be "
            f"pickled ({e}). Define map/filter functions at module level (not lambdas or "
            "closures), or use runner='thread'."
        ) from None


def _context():
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class ProcessExecutor(PriorityGate):
    """A process pool fed two units per worker at a time (to hide the hand-over), most urgent first."""

    def __init__(self, work, parallelism: int):
        pool = ProcessPoolExecutor(
            parallelism,
            mp_context=_context(),
            initializer=_install,
            initargs=(check_picklable(work),),
        )
        super().__init__(
            lambda unit: pool.submit(_run, unit),
            2 * parallelism,
            lambda: pool.shutdown(wait=False, cancel_futures=True),
        )


class ProcessRunner(Runner):
    name = "process"
    background = True

    def executor(self, work, parallelism: int) -> Executor:
        return InlineExecutor(work) if parallelism == 0 else ProcessExecutor(work, parallelism)
