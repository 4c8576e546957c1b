"""Record operators: read a chunk, map and filter records. All stateless."""

from __future__ import annotations

import hashlib
import pickle
import re
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from zephon.io import Chunk, Dataset
from zephon.io.formats import BadRecord
from zephon.io.remote import IOConfig, Requests
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
        dataset = self.datasets[chunk.dataset]
        requests = Requests()
        read = dataset.read_chunk(chunk, self.io, requests)
        records = read.records[chunk.skip :]
        numbers = np.arange(chunk.skip, chunk.skip + len(records))
        skip_bad = dataset.on_error == "skip"
        block = RecordBlock(
            chunk.dataset, records, numbers, {}, skip_bad, [], read.digest, requests.as_tuple()
        )
        if not block.skip_bad:
            return block
        bad = {i: r.message for i, r in enumerate(records) if isinstance(r, BadRecord)}
        return block.without(bad) if bad else block

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
        out, bad = _each(self._map, block)
        mapped = RecordBlock(block.dataset, out, block.numbers, block.counters, block.skip_bad, block.skipped)
        return mapped.without(bad) if bad else mapped

    def _map(self, record: dict) -> dict:
        new = self.fn(record)
        if not isinstance(new, dict):
            raise ValueError(
                f"map function {function_fingerprint(self.fn).split(':')[0]} returned "
                f"{type(new).__name__}, expected a dict record (use .filter to drop records)"
            )
        return new


class Filter(_RecordFunction):
    """Keeps the records for which ``fn(record)`` is true; counts the others."""

    kind = "filter"

    def work(self, block: RecordBlock) -> RecordBlock:
        verdicts, bad = _each(lambda r: bool(self.fn(r)), block)
        if bad:
            block = block.without(bad)
            verdicts = [v for i, v in enumerate(verdicts) if i not in bad]
        keep = np.array(verdicts, bool)
        kept = [r for r, k in zip(block.records, keep, strict=True) if k]
        counters = dict(block.counters)
        counters["filtered_records"] = counters.get("filtered_records", 0) + len(block) - len(kept)
        return RecordBlock(block.dataset, kept, block.numbers[keep], counters, block.skip_bad, block.skipped)


def _each(fn, block: RecordBlock) -> tuple[list, dict[int, str]]:
    """``fn`` on every record of ``block``: (its results, the records it raised on as position:
    why). Those are collected where the block skips bad records; otherwise the first error is
    raised, knowing which record of the chunk it was about (``zephon_record``)."""
    out, bad = [], {}
    for i, r in enumerate(block.records):
        try:
            out.append(fn(r))
        except Exception as e:
            if not block.skip_bad:
                e.zephon_record = int(block.numbers[i])
                raise
            bad[i] = "".join(traceback.format_exception_only(type(e), e)).strip()
            out.append(None)
    return out, bad
