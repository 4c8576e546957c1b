"""The cases of ``benchmarks/reliability.py``, and the setups they share.

A case is a function ``(tmp, gpt2) -> (error, seconds, note)`` registered under its name with
``@case(name)``: the error the operation ended with (None where it ended without one), the wall
seconds from starting the operation to the error, and a note of what was measured. A case that
cannot reproduce its fault raises :class:`Outcome`. The material is the tests' own
(``tests/support``: fake stores, corpora, damaged files, scripts; ``zephon.testing``); what
the cases share beyond it is here.
"""

from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "scripts")]  # support/, train_jobs
CASES: dict[str, tuple] = {}
TIMEOUT = 120  # seconds per case, unless the case says


def case(name: str, timeout: float = TIMEOUT, drop_root: bool = False):
    """Registers a case; ``drop_root``: run it without root's right to write anywhere."""

    def register(fn):
        CASES[name] = (fn, timeout, drop_root)
        return fn

    return register


class Outcome(Exception):
    """Raised by a case that ends without the error it looks for (or on purpose without one)."""


class Said(Exception):
    """What a process said as it ended: its last line, with its exit status as the kind (or the
    kind of error it reported)."""

    def __init__(self, status: int, line: str, kind: str | None = None):
        super().__init__(line)
        self.kind = kind or f"exit {status}"


def timed(fn) -> tuple[BaseException | None, float]:
    """(the error ``fn()`` raised or None, the wall seconds it took)."""
    start = time.monotonic()
    try:
        fn()
    except Exception as e:  # the error a case is about
        return e, time.monotonic() - start
    return None, time.monotonic() - start


def lines(n: int = 3000) -> list[str]:
    """Same-length JSON lines, so that a reordered copy has the same size."""
    return [json.dumps({"text": f"document number {i:05d} " * 8}) for i in range(n)]


def write_lines(path: str, rows: list[str], mtime: float | None = None) -> str:
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def tokens(ds, gpt2: str, length: int = 32, rows: int = 2, **options):
    """``ds`` tokenized, packed into rows of ``length``, batches of ``rows``, with ``options``."""
    from zephon import Pipeline

    return Pipeline(ds).options(**options).tokenize(gpt2).pack_flat(length).batch(rows)


def iterate_until_error(iterator) -> None:
    n = 0
    for n, _ in enumerate(iterator, 1):
        if n == 10**5:
            break
    raise Outcome(f"no error in the {n} batches that followed")


def state_after(pipeline, batches: int) -> dict:
    """The state after ``batches`` batches, as JSON gives it back; the pipeline closed."""
    from zephon.testing import take

    take(pipeline, batches)
    state = pipeline.state_dict()
    pipeline.close()
    return json.loads(json.dumps(state))


def refused_restore(make, state: dict, batches: int = 1) -> tuple[BaseException | None, float]:
    """A new pipeline of ``make()`` restored from ``state`` and iterated ``batches`` batches: the
    error and the time from making the pipeline to the error."""
    from zephon.testing import take

    def resume():
        pipeline = make()
        try:
            pipeline.load_state_dict(state)
            take(pipeline, batches)
        finally:
            pipeline.close()

    return timed(resume)


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else ""


def run_process(command: list[str], timeout: float = 120, **kwargs) -> tuple[Said, float, list]:
    """Runs ``command`` (stderr into stdout): (its exit status and last line, its wall seconds,
    [(seconds since start, line)] of its output)."""
    import subprocess

    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
    timeline = [(time.monotonic() - start, line.rstrip("\n")) for line in proc.stdout]
    proc.wait(timeout=timeout)
    seconds = time.monotonic() - start
    return Said(proc.returncode, timeline[-1][1] if timeline else ""), seconds, timeline
