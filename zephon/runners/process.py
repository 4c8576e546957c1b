"""The process runner: worker processes per operator, for work that holds the GIL.

Each worker process receives the work function once, when it starts (not once per unit), so
heavy state such as a tokenizer is loaded once per worker. Workers are started with
``forkserver`` (``spawn`` where unavailable): forking a process that runs threads is unsafe. The
fork server imports what the work needs and loads its tokenizers (``zephon.runners.preload``)
once, before it forks the first worker, so workers start with them.

Workers end when the process that made the pool ends, however it ends (a watcher thread in each
worker waits on it), so a killed training process leaves no worker behind; the fork server goes
with its last worker. An error a worker raises reaches the caller as an error of its type and
message even when pickle alone cannot rebuild it (else as a RuntimeError carrying its text).
Large results come back through shared memory (``zephon.runners.handover``), not the pipe.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import multiprocessing
import os
import pickle
import select
import socket
import sys
import threading
import time
import traceback
from collections import deque
from concurrent.futures import BrokenExecutor, Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Any

from zephon.runners import arena, handover
from zephon.runners.base import Executor, InlineExecutor, Runner, held_longest, run_into
from zephon.runners.mainguard import check_main_is_guarded
from zephon.runners.priority import UrgentQueue, end_at_exit

log = logging.getLogger(__name__)

STARTING = "the start of the worker processes (each loads the work: its tokenizer)"
_WORK = None  # the work function of this worker process
_SHIP = None  # where this worker puts large results for the pool's owner (handover.prefix)
_RING = None  # its arena for them (zephon.runners.arena), where there is shared memory


def _install(payload: bytes, owner: int, ship: str | None) -> None:
    global _WORK, _SHIP, _RING
    _SHIP = ship
    _RING = arena.Arena(f"{ship}arena-{os.getpid()}") if ship is not None else None
    _end_with(owner)
    # one thread per worker in the tokenizers' own pools and torch's (images(resizer="torch")): the
    # runner's parallelism is the knob. torch reads OMP_NUM_THREADS where it is imported after this;
    # where the fork server imported it already (a training script's main module does), it is told
    for name in ("FASTOKENS_BPE_THREADS", "RAYON_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    if "torch" in sys.modules and os.environ["OMP_NUM_THREADS"].isdigit():
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
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


# What a worker imports to load and run its work, imported once in the fork server, so that a
# worker forked from it starts with them (a third of a second a worker here, on 2 busy cores).
PRELOAD = ("zephon.lanes", "zephon.io", "zephon.ops", "numpy", "msgspec", "tokenizers", "fastokens")
# names the tokenizers that the fork server loads (zephon.runners.preload), in its environment
PRELOAD_TOKENIZERS = "ZEPHON_PRELOAD_TOKENIZERS"


def _context(imports: tuple[str, ...] = (), tokenizers: tuple[tuple[str, str], ...] = (), start: bool = True):
    """The processes' context; where it is the fork server, that server imports ``PRELOAD`` and
    ``imports`` (the work's: ``WorkOperator.imports``) once, and its workers start with them.
    With ``start``, a fork server not running yet is started here (``_start_server``), and loads
    ``tokenizers`` (the work's: ``WorkOperator.tokenizers``) once for all its workers
    (``zephon.runners.preload``); a fork server already running keeps what it has, and its
    workers load what it lacks."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    from multiprocessing import forkserver

    server = forkserver._forkserver
    # added to what is asked already (the main module, by default); a fork server already running
    # keeps its own, and a module that is not installed is skipped by the fork server
    asked = list(getattr(server, "_preload_modules", None) or ["__main__"])
    wanted = (*PRELOAD, *imports, *(("zephon.runners.preload",) if tokenizers else ()))
    context.set_forkserver_preload(asked + [m for m in wanted if m not in asked])
    if start:
        _start_server(tokenizers)
    return context


def _server_running() -> bool:
    from multiprocessing import forkserver

    return getattr(forkserver._forkserver, "_forkserver_pid", None) is not None


def _start_server(tokenizers: tuple[tuple[str, str], ...]) -> None:
    """Start the fork server, where it is not running and there are ``tokenizers`` for it to
    load (without, the first worker's start starts it). It reads their names from the environment
    it starts with: no thread may run a tokenizer meanwhile (a native library reading the
    environment while it changes may read freed memory)."""
    from multiprocessing import forkserver

    if tokenizers and not _server_running():
        # the server takes the environment it starts with: the names are there only meanwhile
        os.environ[PRELOAD_TOKENIZERS] = json.dumps(tokenizers)
        try:
            forkserver._forkserver.ensure_running()
        finally:
            os.environ.pop(PRELOAD_TOKENIZERS, None)


def _context_for(work, start: bool = True):
    """``_context`` for ``work``: its imports and tokenizers, where it names them."""
    return _context(tuple(getattr(work, "imports", ())), tuple(getattr(work, "tokenizers", ())), start)


def _serve(conn, payload: bytes, owner: int, ship: str | None) -> None:
    """A worker process: load the work, say so, then run each unit that comes down ``conn`` and
    send back ``("ok", result)`` or ``("error", exception)``, in order, until told to stop."""
    _install(payload, owner, ship)
    try:
        prepare = getattr(_WORK, "prepare", None)
        if prepare is not None:
            prepare()  # its tokenizer, fast backend included
    except Exception:  # the units will say what is wrong, each with its own error
        pass
    try:
        conn.send(("up", _RING and _RING.path))
    except OSError:  # the owner went meanwhile (its end of the pipe closed): nothing to serve
        return
    while True:
        try:
            sent = conn.recv()
        except (EOFError, OSError):  # the owner went
            return
        if sent is None:
            return
        unit, read = sent
        if _RING is not None:
            _RING.heard(read)
        try:
            answer = ("ok", handover.ship(_WORK(unit), _SHIP, _RING))
        except BaseException as e:
            _fit_to_travel(e)
            answer = ("error", (e, "".join(traceback.format_exception(type(e), e, e.__traceback__))))
        try:
            _answer(conn, answer)
        except OSError:  # the owner went while this unit was at work: what it shipped is orphaned
            handover.remove_all(_SHIP)
            return


def _answer(conn, answer) -> None:
    """Send ``answer``; one that cannot travel goes as its unit's error (OSError: the pipe)."""
    try:
        conn.send(answer)
    except OSError:
        raise
    except Exception as e:
        conn.send(("error", (RuntimeError(f"a worker's result could not be sent back: {e!r}"), "")))


class WorkerTraceback(Exception):
    """Where in a worker process an error was raised: its traceback there, as text (the cause
    of the error as it reaches the owner, so that a traceback shows both sides)."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0]) if self.args else ""


class _Worker:
    """One worker process as its owner sees it: its pipe, the units sent down it in order (each
    ``(future, unit)``), since when its first one has been at work, and its pace: the seconds
    its units take, a running average (None before the first)."""

    def __init__(self, process, conn):
        self.process, self.conn = process, conn
        self.arena: str | None = None  # the path of its arena of results (it says when up)
        self.sent: deque[tuple[Future, Any]] = deque()
        self.since = 0.0
        self.pace: float | None = None

    def done(self, now: float) -> None:
        """Its first unit came back at ``now``."""
        took = now - self.since
        self.pace = took if self.pace is None else 0.75 * self.pace + 0.25 * took
        self.since = now


class ProcessExecutor(Executor):
    """Worker processes, each sent up to ``AT_ONCE`` units at a time, most urgent first, through a
    pipe of its own; up to ``PER_WORKER`` once its units prove ``QUICK`` (a small chunk is under a
    millisecond of work, and with two at a worker it waited for its next one half its time; a
    slow unit, sent ahead, would hold an urgent one behind it in the pipe).

    Units go down a worker's pipe from whichever thread finds it room: the one that submits, or
    this executor's one thread here, which reads every result as it comes back (a shipped one
    from shared memory) and sends that worker its next unit. No feeder, no pool manager: a unit
    crosses one thread of this process each way.

    Until its first worker is up (the fork server starts, where it is not running, once this
    process's own tokenizers are ready, then starts an interpreter, imports, loads the tokenizer
    and its fast backend, and forks it: a second or more on a busy machine), the
    units run one at a time on a thread of this process, which holds the work already, most
    urgent first, so the first batches do not wait for the workers; the rest wait in the queue.
    The work is stateless: where a unit runs does not change its result, nor its error. After
    ``timeout`` seconds the thread here stops and workers not up yet get the work anyway, and
    the watchdog of stuck workers reports their start. A worker that dies breaks the executor:
    every unit sent or queued fails with BrokenProcessPool, the other workers are ended, and it
    takes no more work.
    ``shared_memory``: the folder in memory through which large results come back (None: all
    through the pipe).
    """

    AT_ONCE = 2
    PER_WORKER = 4
    QUICK = 0.002  # seconds a unit, on average: under this a worker is sent PER_WORKER at a time
    DEFER = 1.0  # seconds at most that a fork server not running waits for this process's tokenizers

    def __init__(self, work, parallelism: int, timeout: float, shared_memory: str | None = handover.SHM):
        check_main_is_guarded()
        self.work, self.timeout, self.parallelism = work, timeout, max(1, parallelism)
        self.payload = check_picklable(work)
        self.ship = handover.prefix(shared_memory) if shared_memory else None
        self.tokenizers = tuple(getattr(work, "tokenizers", ()))
        # a fork server not running yet (no warm_up) starts once this process's own tokenizers
        # are ready, between two units (``_start_server_here``); at once where it has modules to
        # import for the work (torch: a second or two, the longer part of its start)
        self.context = _context_for(work, start=bool(getattr(work, "imports", ())))
        forkserver = self.context.get_start_method() == "forkserver"
        self.deferred = forkserver and bool(self.tokenizers) and not _server_running()
        self.holding = False  # the start thread takes no unit while the fork server starts
        self.queue = UrgentQueue()
        self.ready = self.queue.ready  # guards the workers' state too
        self.workers: list[_Worker] = []
        self.pool_up, self.broken, self.created = False, None, time.monotonic()
        self.closed_at: float | None = None  # when shut down: the units at work have ``timeout`` more
        self.here: tuple[float, Any] | None = None  # the unit at work on the start thread, since when
        # wakes the receiver (to end); sockets, so that a write after they are closed fails
        # instead of landing in whatever file took the number of a closed descriptor
        self.wake_read, self.wake_write = socket.socketpair()
        self.wake_read.setblocking(False)
        self.wake_write.setblocking(False)
        self.receiver = threading.Thread(target=self._receive, name="zephon-results", daemon=True)
        self.receiver.start()
        # the start thread runs units here (a tokenizer's native code): joined at exit, as thread
        # workers are (zephon.runners.priority.end_at_exit)
        self.threads = [threading.Thread(target=self._start_here, name="zephon-work-start", daemon=True)]
        end_at_exit(self)
        self.threads[0].start()

    # -- submitting ---------------------------------------------------------------------------

    def submit(self, unit: Any, priority: tuple = ()) -> Future:
        if self.broken is not None:
            future: Future = Future()
            future.set_exception(self.broken)
            return future
        future = self.queue.put(unit, priority)
        with self.ready:
            self._send()
        return future

    def hurry(self, future: Future) -> None:
        self.queue.hurry(future)

    def reorder(self, future: Future, priority: tuple) -> None:
        self.queue.reorder(future, priority)

    def _open(self) -> bool:
        """Whether the workers take units: one is up, or they are late (then the watchdog says so)."""
        return self.pool_up or time.monotonic() - self.created > self.timeout

    def _send(self) -> None:
        """Down every worker's pipe that has room, the most urgent units; holding ``ready``."""
        if self.broken is not None or self.queue.closed or not self.workers or not self._open():
            return
        now = time.monotonic()
        for worker in sorted(self.workers, key=lambda w: len(w.sent)):
            most = self.PER_WORKER if worker.pace is not None and worker.pace < self.QUICK else self.AT_ONCE
            while len(worker.sent) < most:
                taken = self.queue.pop()
                if taken is None:
                    return
                unit, future = taken
                if not worker.sent:
                    worker.since = now
                worker.sent.append((future, unit))
                try:  # with how far its arena has been read: what it may put there again
                    worker.conn.send((unit, arena.read_of(worker.arena)))
                except (OSError, ValueError):  # the worker is gone: its pipe's end tells the receiver
                    return

    def _start_here(self) -> None:
        """Until a worker is up, run the most urgent unit here, one at a time; not past
        ``timeout``: a pool that never comes up (its fork server stuck) is reported as such
        (``stuck``) when the run waits for the units it holds, not served here unseen."""
        while True:
            with self.ready:
                while not (
                    self.queue.closed or self.broken or self._open() or (self.queue.heap and not self.holding)
                ):
                    self.ready.wait(max(0.0, self.created + self.timeout - time.monotonic()) + 0.01)
                if self.queue.closed or self.broken or self._open():  # (open: up, or late)
                    return
                taken = self.queue.pop()
                if taken is None:
                    continue
                unit, future = taken
                self.here = (time.monotonic(), unit)
            try:
                run_into(future, self.work, unit)
            finally:
                with self.ready:
                    self.here = None
                    if self.holding:
                        self.ready.notify_all()
            del unit, future, taken

    def _start_server_here(self) -> None:
        """Start the fork server, once this process's own tokenizers are loaded and their fast
        backends ready, between two of the start thread's units (``DEFER`` seconds for each). Where
        a fast backend is still loading here after that, or a unit still running, no server is
        started here (its names go through the environment, which both read): the first worker's
        start starts it, and each worker loads its tokenizers, as where the server has none.
        Started with the pool, the server's imports and tokenizer loads took the cores this
        process was loading its own on and making its first batch with. Side by side, two
        process workers on 2 cores, fresh processes alternated (medians): over 8M tokens (six
        pairs) the first batch came at 0.23 s against 0.27 s, and 9.51M tokens/s against 8.79M;
        over 60M (three pairs) 20.54M against 20.79M, the same within this host's noise. Not
        where the server imports torch for the work: its start is long, and the pool's later start
        cost more than the cores shared (image-text, torch resizing, 2M usable tokens, three
        pairs: two workers 74.7k usable tokens/s against 77.0k, one 44.9k against 44.4k)."""
        from zephon.io import tokenizer

        if not tokenizer.wait_settled(self.tokenizers, self.DEFER) and tokenizer.loading(self.tokenizers):
            return  # a fast backend still loading here (probing, say): the workers load theirs
        with self.ready:
            self.holding = True
            try:
                between = self.ready.wait_for(lambda: self.here is None or self.queue.closed, self.DEFER)
                if between and not self.queue.closed and self.broken is None:
                    _start_server(self.tokenizers)
            finally:  # (a unit that ran on: the first worker's start starts the server, without them)
                self.holding = False
                self.ready.notify_all()

    # -- receiving ----------------------------------------------------------------------------

    def _receive(self) -> None:
        try:
            if self.deferred:
                self._start_server_here()
            self._start_workers()
            while self._receive_some():
                pass
        except BaseException as e:  # not expected: the executor cannot go on, and says why
            self._break(
                e if isinstance(e, BrokenExecutor) else BrokenProcessPool(f"the worker pool failed: {e!r}")
            )
        finally:
            self._end_workers()

    def _start_workers(self) -> None:
        context = self.context
        for k in range(self.parallelism):
            if self.queue.closed:
                return
            ours, theirs = context.Pipe()
            process = context.Process(
                target=_serve, args=(theirs, self.payload, os.getpid(), self.ship), daemon=True,
                name=f"zephon-worker-{k}",
            )  # fmt: skip
            process.start()
            theirs.close()
            with self.ready:
                self.workers.append(_Worker(process, ours))
                self._send()  # late starters get the work at once

    def _receive_some(self) -> bool:
        """Read what the workers sent back; False once there is nothing more to wait for."""
        with self.ready:
            if self.broken is not None or (self.queue.closed and not any(w.sent for w in self.workers)):
                return False
            pipes = {w.conn: w for w in self.workers}
        late = None if self.pool_up else max(0.0, self.created + self.timeout - time.monotonic()) + 0.01
        if self.closed_at is not None:  # shut down: the units at the workers have timeout to come back
            left = self.closed_at + self.timeout - time.monotonic()
            if left <= 0:
                self._abandon()
                return False
            late = left if late is None else min(late, left)
        for conn in wait([*pipes, self.wake_read], timeout=late):
            if conn is self.wake_read:
                with contextlib.suppress(BlockingIOError):
                    self.wake_read.recv(1 << 12)
                continue
            worker = pipes[conn]
            try:
                kind, value = conn.recv()
            except (EOFError, OSError):
                code = worker.process.exitcode
                self._break(BrokenProcessPool(
                    f"a worker process ended abruptly (exit code {code}) while it had units to do"
                ))  # fmt: skip
                return False
            except Exception as e:  # a result that could not be read back: its unit's error
                kind, value = "error", (e, "")
            if kind == "up":
                with self.ready:
                    worker.arena = value
                    self.pool_up = True
                    self._send()
                    self.ready.notify_all()  # the start thread ends
                continue
            with self.ready:
                future, _ = worker.sent.popleft()
                worker.done(time.monotonic())
                self._send()
            if kind == "ok":
                future.set_result(value)
            else:
                error, text = value
                if text:
                    error.__cause__ = WorkerTraceback(text)
                future.set_exception(error)
            del future, value
        if not self.pool_up:
            with self.ready:
                self._send()  # late: the workers get the work anyway
        return True

    def _break(self, error: BaseException) -> None:
        """A worker died: every unit sent or queued fails with ``error``, and so will new ones."""
        with self.ready:
            if self.broken is not None:
                return
            self.broken = error
            failed = [future for w in self.workers for future, _ in w.sent]
            for w in self.workers:
                w.sent.clear()
            while (taken := self.queue.pop()) is not None:
                failed.append(taken[1])
            self.ready.notify_all()
            workers = list(self.workers)
        for w in workers:  # the survivors go down with it, before anyone hears of the death
            with contextlib.suppress(OSError):
                w.process.kill()
        for future in failed:
            if not future.done():
                future.set_exception(error)

    def _abandon(self) -> None:
        """Shut down, and units at the workers did not come back within ``timeout``: they fail,
        said in the log, and the workers are ended (killed where they do not stop)."""
        with self.ready:
            held = [(future, unit) for w in self.workers for future, unit in w.sent]
            for w in self.workers:
                w.sent.clear()
        if not held:
            return
        what = (
            f"{len(held)} unit(s) did not come back from the worker processes within worker_timeout "
            f"({self.timeout:g} s) of the shutdown (the first: {held[0][1]!r}); the workers are ended"
        )
        log.warning("zephon: %s", what)
        for future, _ in held:
            if not future.done():
                future.set_exception(TimeoutError(what))

    def _end_workers(self) -> None:
        """Once closed and the units sent are back: the workers end, and the files of results
        never read go. Once broken: the workers are ended already; the file a worker that died
        was writing stays until the executor is shut down."""
        with self.ready:
            workers = list(self.workers)
        for w in workers:
            with contextlib.suppress(OSError, ValueError):
                w.conn.send(None)
        for w in workers:
            w.process.join(timeout=5.0)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout=5.0)
            w.conn.close()
        if self.ship is not None and self.broken is None:
            handover.remove_all(self.ship)
        self.wake_read.close()
        self.wake_write.close()

    # -- watching and ending ------------------------------------------------------------------

    def stuck(self, timeout: float):
        now = time.monotonic()
        with self.ready:
            if not self.pool_up and now - self.created > timeout:
                return STARTING
            held = [(w.since, w.sent[0][1]) for w in self.workers if w.sent]
        here = self.here  # read once: the start thread may end its unit meanwhile
        return held_longest(held if here is None else [*held, here], timeout)

    def at_work(self) -> list[Any]:
        """The unit the start thread is running in this process, if any."""
        here = self.here
        return [] if here is None else [here[1]]

    def shutdown(self) -> None:
        """Queued units are cancelled; the units at the workers come back, then the workers end
        (the receiver thread sees to it; units not back within ``timeout`` fail, logged, and the
        workers are ended). Never waits, except after a worker died: then the others are ended
        and their files removed at once."""
        if self.closed_at is None:
            self.closed_at = time.monotonic()
        self.queue.close()
        with contextlib.suppress(OSError):
            self.wake_write.send(b"x")
        if self.broken is not None:
            self.receiver.join(timeout=10.0)
            handover.remove_all(self.ship)


class ProcessRunner(Runner):
    name = "process"
    background = True
    units_ahead = 2 * ProcessExecutor.PER_WORKER  # those at a worker, and as many to follow

    def executor(self, work, parallelism: int, timeout: float) -> Executor:
        return InlineExecutor(work) if parallelism == 0 else ProcessExecutor(work, parallelism, timeout)

    def warm_up(self, work) -> None:
        """The fork server, started now: it imports what ``work`` needs and loads its tokenizers
        while the caller goes on, and the first pool's workers fork from it at once (started by
        the pool instead, once this process's own tokenizers are ready, it is up a second after
        that on 2 busy cores, three with torch to import for image work, and until then one
        thread of this process runs the units). A
        server already running is left as it is. A script that would run again in the server
        (no main guard) is told now, as a pool would tell it."""
        check_main_is_guarded()
        context = _context_for(work)
        if context.get_start_method() == "forkserver":
            from multiprocessing import forkserver

            forkserver.ensure_running()  # (started already where the work has tokenizers)
