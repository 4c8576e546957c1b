"""The process runner: a process pool per operator, for work that holds the GIL.

Each worker process receives the work function once, when it starts (not once per unit), so
heavy state such as a tokenizer is loaded once per worker. Workers are started with
``forkserver`` (``spawn`` where unavailable): forking a process that runs threads is unsafe.

Workers end when the process that made the pool ends, however it ends (a watcher thread in each
worker waits on it), so a killed training process leaves no worker behind; the fork server goes
with its last worker. An error a worker raises reaches the caller as an error of its type and
message even when pickle alone cannot rebuild it (else as a RuntimeError carrying its text).
Large results come back through shared memory (``zephon.runners.handover``), not the pool's pipe.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import select
import sys
import threading
import time
import traceback
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.reduction import ForkingPickler

from zephon.runners import handover
from zephon.runners.base import Executor, Held, InlineExecutor, Runner
from zephon.runners.mainguard import check_main_is_guarded
from zephon.runners.priority import PriorityGate

STARTING = "the start of the worker processes (each loads the work: its tokenizer)"
_WORK = None  # the work function of this worker process
_SHIP = None  # where this worker puts large results for the pool's owner (handover.prefix)


def _install(payload: bytes, owner: int, ship: str | None) -> None:
    global _WORK, _SHIP
    _SHIP = ship
    _end_with(owner)
    # one thread per worker in the tokenizers' own pools: the runner's parallelism is the knob
    for name in ("FASTOKENS_BPE_THREADS", "RAYON_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    _WORK = pickle.loads(payload)


def _end_with(owner: int) -> None:
    """Exit this worker when process ``owner`` (the one that made the pool) ends. The pool's own
    pipes don't tell: every worker holds both of their ends, so none sees the owner go."""

    def watch():
        try:
            fd = os.pidfd_open(owner)  # Linux 5.3+: readable once the process has ended
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            select.select([fd], [], [])
        else:
            while handover.alive(owner):
                time.sleep(1.0)
        handover.remove_all(_SHIP)  # results the owner will never read
        os._exit(1)

    threading.Thread(target=watch, name="zephon-owner-watch", daemon=True).start()


def _run(unit):
    try:
        result = _WORK(unit)
    except BaseException as e:
        _fit_to_travel(e)
        raise
    return handover.ship(result, _SHIP)


def _fit_to_travel(error: BaseException) -> None:
    """Have ``error`` reach the pool's owner as an error of its own type and message, even where
    pickle alone cannot rebuild it (a class whose constructor takes other arguments than its
    message): unpickling it there would break the pool. Errors of its class go by their parts."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        ForkingPickler.register(type(error), _by_parts)


def _by_parts(error: BaseException):
    """Pickle ``error`` as its class's name, args, attributes (notes included) and text."""
    cls, message = type(error), str(error)
    text = "".join(traceback.format_exception_only(cls, error)).strip()
    state = {k: v for k, v in getattr(error, "__dict__", {}).items() if _picklable(v)}
    args = error.args if _picklable(error.args) else (message,)
    return _rebuild, (cls.__module__, cls.__qualname__, args, state, message, text)


def _picklable(value) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


def _rebuild(module: str, qualname: str, args: tuple, state: dict, message: str, text: str) -> BaseException:
    """The error a worker raised, made without its constructor; where its class cannot be found
    here or the result would say something else, a RuntimeError that carries its text. Never
    raises: an error here would break the pool."""
    try:
        cls = sys.modules.get(module) or importlib.import_module(module)
        for name in qualname.split("."):
            cls = getattr(cls, name)
        error = cls.__new__(cls, *args)
        error.args = args
        error.__dict__.update(state)
        if isinstance(error, BaseException) and str(error) == message:
            return error
    except Exception:
        pass
    return RuntimeError(f"{text} (raised in a worker process)")


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


def _up() -> None:
    """A worker's first task: it returns once the worker has started and loaded what the work
    needs (its tokenizer, fast backend included)."""
    prepare = getattr(_WORK, "prepare", None)
    if prepare is not None:
        prepare()


class ProcessExecutor(PriorityGate):
    """A process pool fed two units per worker at a time (to hide the hand-over), most urgent first.

    Until its first worker is up (a worker starts an interpreter, imports, loads the tokenizer
    and its fast backend: about a second on a busy machine), the units run one at a time on a
    thread of this process, which holds the work already, most urgent first, so the first
    batches do not wait for the pool; the rest wait in the queue, not in the pool. The work is
    stateless: where a unit runs does not change its result, nor its error. A pool not up after
    ``timeout`` seconds gets the work anyway, and the watchdog of stuck workers reports it.
    ``shared_memory``: the folder in memory through which large results come back (None: all
    through the pool's pipe).
    """

    def __init__(self, work, parallelism: int, timeout: float, shared_memory: str | None = handover.SHM):
        check_main_is_guarded()
        ship = handover.prefix(shared_memory) if shared_memory else None
        pool = ProcessPoolExecutor(
            parallelism,
            mp_context=_context(),
            initializer=_install,
            initargs=(check_picklable(work), os.getpid(), ship),
        )
        here = ThreadPoolExecutor(1, thread_name_prefix="zephon-work-start")
        self.pool_up, started, limit = False, time.monotonic(), 2 * parallelism
        self.broken = False  # a worker died: the pool ends the others and takes no more work

        def submit(unit) -> Future:
            if not self.pool_up and time.monotonic() - started > timeout:  # stuck starting
                self._open(limit)  # the pool's watchdog then says so
            if not self.pool_up:
                return self.held.track(unit, here.submit(work, unit))
            future = pool.submit(_run, unit)
            future.add_done_callback(self._note_broken)
            return self.held.track(unit, future)

        def shutdown() -> None:
            here.shutdown(wait=False, cancel_futures=True)
            pool.shutdown(wait=False, cancel_futures=True)

        self.pool, self.ship, self.held = pool, ship, Held()
        super().__init__(submit, 1, shutdown)  # one at a time here until the pool is up
        starting = self.held.track(STARTING, pool.submit(_up))  # the watchdog times the start too
        starting.add_done_callback(lambda _: self._open(limit))  # failed: up too

    def _note_broken(self, future: Future) -> None:
        if not future.cancelled() and isinstance(future.exception(), BrokenProcessPool):
            self.broken = True

    def shutdown(self) -> None:
        super().shutdown()
        if self.broken and self.ship is not None:
            # the other workers are being ended (SIGTERM) and nothing is read any more: once they
            # are joined (at once), the half-written result of the dead one goes now, not later
            self.pool.shutdown(wait=True)
            handover.remove_all(self.ship)

    def _feed(self) -> None:
        super()._feed()
        # closed: once the units at work are back (received, their files removed), the files of
        # a worker that died. Here, on the feeder's way out: a shutdown may come from a finalizer,
        # where starting a thread can deadlock
        if self.ship is not None:
            self.pool.shutdown(wait=True)
            handover.remove_all(self.ship)

    def stuck(self, timeout: float):
        return self.held.longest(timeout)

    def _open(self, limit: int) -> None:
        """The pool is up (or will never be): it takes the work, ``limit`` units at a time."""
        with self.ready:
            self.pool_up, self.limit = True, limit
            self.ready.notify()


class ProcessRunner(Runner):
    name = "process"
    background = True

    def executor(self, work, parallelism: int, timeout: float) -> Executor:
        return InlineExecutor(work) if parallelism == 0 else ProcessExecutor(work, parallelism, timeout)
