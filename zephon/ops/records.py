"""Record operators: read a chunk, map and filter records. All stateless."""

from __future__ import annotations

import hashlib
import pickle
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from zephon.io import Chunk, Dataset
from zephon.io.remote import IOConfig
from zephon.ops.base import WorkOperator
from zephon.ops.containers import RecordBlock


class Read(WorkOperator):
    """Reads a chunk into records. The first operator of every pipeline, added by the pipeline."""

    kind = "read"
    takes = ("chunks",)
    gives = "records"

    def __init__(self, datasets: list[Dataset], io: IOConfig, parallelism: int | None = None):
        super().__init__(parallelism)
        self.datasets, self.io = datasets, io

    def work(self, chunk: Chunk) -> RecordBlock:
        records = self.datasets[chunk.dataset].read(chunk, self.io)[chunk.skip :]
        return RecordBlock(chunk.dataset, records, np.arange(chunk.skip, chunk.skip + len(records)))

    def params(self) -> dict:
        return {}


def function_fingerprint(fn: Callable) -> str:
    """Name plus a digest of the code, its default arguments and the values its closure
    captured, so that an edited map or filter (or one built with another threshold) changes the
    recipe. Globals it reads by name are not included: pass such settings as arguments."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    code = getattr(fn, "__code__", None)
    if code is None:
        try:
            payload = pickle.dumps(fn)
        except Exception:
            payload = name.encode()
    else:
        cells = [c.cell_contents for c in (fn.__closure__ or ()) if _filled(c)]
        # object addresses differ from process to process: not part of what was captured
        captured = re.sub(
            r" at 0x[0-9a-fA-F]+", "", repr((fn.__defaults__, fn.__kwdefaults__, cells))
        ).encode()
        payload = _code_bytes(code) + b"|" + captured
    return f"{name}:{hashlib.sha256(payload).hexdigest()[:12]}"


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _code_bytes(code) -> bytes:
    consts = [_code_bytes(c) if hasattr(c, "co_code") else repr(c).encode() for c in code.co_consts]
    return b"|".join([code.co_code, repr(code.co_names).encode(), *consts])


class _RecordFunction(WorkOperator):
    takes = ("records",)
    gives = "records"

    def __init__(self, fn: Callable[[dict], Any], parallelism: int | None = None):
        if not callable(fn):
            raise ValueError(f"{self.kind} needs a callable, got {fn!r}")
        super().__init__(parallelism)
        self.fn = fn

    def params(self) -> dict:
        return {"fn": function_fingerprint(self.fn)}


class Map(_RecordFunction):
    """``fn(record) -> record``, on every record."""

    kind = "map"

    def work(self, block: RecordBlock) -> RecordBlock:
        out = []
        for i, r in enumerate(block.records):
            new = _call(self.fn, r, block, i)
            if not isinstance(new, dict):
                raise _about(
                    block,
                    i,
                    ValueError(
                        f"map function {function_fingerprint(self.fn).split(':')[0]} returned "
                        f"{type(new).__name__}, expected a dict record (use .filter to drop records)"
                    ),
                )
            out.append(new)
        return RecordBlock(block.dataset, out, block.numbers, block.counters)


class Filter(_RecordFunction):
    """Keeps the records for which ``fn(record)`` is true; counts the others."""

    kind = "filter"

    def work(self, block: RecordBlock) -> RecordBlock:
        keep = np.fromiter(
            (bool(_call(self.fn, r, block, i)) for i, r in enumerate(block.records)), bool, len(block)
        )
        kept = [r for r, k in zip(block.records, keep, strict=True) if k]
        counters = dict(block.counters)
        counters["filtered_records"] = counters.get("filtered_records", 0) + len(block) - len(kept)
        return RecordBlock(block.dataset, kept, block.numbers[keep], counters)


def _call(fn, record: dict, block: RecordBlock, i: int):
    """``fn(record)``; an error it raises learns which record of the chunk it was about."""
    try:
        return fn(record)
    except Exception as e:
        e.zephon_record = int(block.numbers[i])
        raise


def _about(block: RecordBlock, i: int, error: Exception) -> Exception:
    error.zephon_record = int(block.numbers[i])
    return error
