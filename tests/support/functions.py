"""Record functions at module level, so that the process runner can send them to workers."""

from __future__ import annotations

import os
import time


def shout(record: dict) -> dict:
    """Upper-case the text."""
    return {**record, "text": record["text"].upper()}


def long_enough(record: dict) -> bool:
    """Keep records of at least five words."""
    return record["text"].count(" ") >= 4


def keeps_most(record: dict) -> bool:
    """Drop the records whose text mentions a number ending in 5."""
    return "5 " not in record["text"]


class TwoArgumentError(Exception):
    """An exception that pickles but cannot be unpickled (its constructor takes two arguments)."""

    def __init__(self, what, where):
        super().__init__(f"{what} at {where}")


def raises_two_argument_error(record: dict) -> dict:
    """Fail on every record, with an exception that cannot travel back from a worker process."""
    raise TwoArgumentError("bad record", record.get("id"))


def failing_on_seven(record: dict) -> dict:
    """Fail (KeyError) on the records whose text ends in " 7"."""
    if record["text"].endswith(" 7"):
        raise KeyError("seven")
    return record


def rename_content(record: dict) -> dict:
    """``{"content": x}`` -> ``{"text": x}``."""
    return {"text": record["content"]}


# A process that runs a process-runner pipeline, prints its child processes' ids and sleeps:
# kill it to see whether its workers, fork server and resource tracker end with it.
# python -c ORPHAN_SCRIPT DATA TOKENIZER
ORPHAN_SCRIPT = """
import sys, time, psutil
from zephon import Dataset, Pipeline
ds = Dataset.from_path("d", sys.argv[1], exhausted="repeat")
pipeline = Pipeline(ds).options(runner="process").tokenize(sys.argv[2], parallelism=2).pack_flat(64).batch(1)
batches, deadline = iter(pipeline), time.monotonic() + 60
while len(psutil.Process().children(recursive=True)) < 3 and time.monotonic() < deadline:
    next(batches)  # until the fork server (started once this process's tokenizer is ready) has children
print(" ".join(str(p.pid) for p in psutil.Process().children(recursive=True)), flush=True)
time.sleep(600)
"""


class SlowToStart:
    """Stateless work whose worker processes take seconds to start (it unpickles slowly): it
    answers ``(unit, the pid that ran it)``."""

    def __call__(self, unit):
        return unit, os.getpid()

    def __getstate__(self):
        return {"slow": True}  # a state, so that unpickling calls __setstate__

    def __setstate__(self, state):
        time.sleep(3)


def sleeping_for(seconds: float) -> float:
    """Work for a process pool that takes ``seconds`` (a unit stuck at a worker, for a while)."""
    time.sleep(seconds)
    return seconds


def sleeping_then_waiting(unit: tuple[float, str | None]) -> float:
    """Work for a process pool: sleep ``unit[0]`` seconds, then wait until the file ``unit[1]``
    exists (if given; at most 30 s): units that stay at a worker until the test lets them go."""
    seconds, path = unit
    time.sleep(seconds)
    deadline = time.monotonic() + 30
    while path is not None and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.002)
    return seconds


class Encoding:
    """A unit: ``(seconds, started)``: encodes text with fastokens (native code that lets go of
    the GIL, a few milliseconds a call) for ``seconds``, having first created the file
    ``started``."""

    def __init__(self, tokenizer_json: str):
        self.tokenizer_json = tokenizer_json

    def __call__(self, unit: tuple[float, str]) -> int:
        import fastokens

        seconds, started = unit
        tokenizer = fastokens.Tokenizer.from_file(self.tokenizer_json)
        text = "In the beginning God created the heaven and the earth. " * 4000
        open(started, "w").close()
        deadline, calls = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            tokenizer.encode_batch_flat([text] * 4)
            calls += 1
        return calls


def counting_to(n: int):
    """Work for a process pool: the numbers 0 to n - 1 as an int64 array (n = 100,000: 800 KB)."""
    import numpy as np

    return np.arange(n, dtype=np.int64)


class ThreadCounts:
    """A unit: the threads a worker gives the tokenizers' pools and torch (imported here, in the
    worker, as images(resizer="torch") does at its first image)."""

    def __call__(self, unit):
        import torch

        names = ("OMP_NUM_THREADS", "RAYON_NUM_THREADS", "FASTOKENS_BPE_THREADS")
        return {name: os.environ.get(name) for name in names} | {"torch": torch.get_num_threads()}


class WhereTokenizerLoaded:
    """A unit: this worker's process id, the one that loaded its tokenizer, and its backend (a
    unit that declares its tokenizer, as ``Tokenize`` does, for the fork server to load it)."""

    def __init__(self, tokenizer_id: str, pause: float = 0.0, imports: tuple[str, ...] = ()):
        self.tokenizer_id, self.tokenizers, self.pause = tokenizer_id, ((tokenizer_id, "auto"),), pause
        self.imports = imports  # modules the fork server imports for it (WorkOperator.imports)

    def __call__(self, unit):
        from zephon.io.tokenizer import load_tokenizer

        tok = load_tokenizer(self.tokenizer_id)
        time.sleep(self.pause)  # a unit's length (seconds)
        return os.getpid(), tok.loaded_in, tok.backend_name
