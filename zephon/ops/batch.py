"""batch: rows -> microbatches of ``microbatch_size`` rows.

A window's last partial microbatch is filled up with padding rows (labels all -100), so no token
is dropped and every microbatch has the same shape.
"""

from __future__ import annotations

from zephon.ops.base import Accumulator, Operator
from zephon.ops.containers import Rows, gather


class BatchRows(Operator):
    kind = "batch"
    takes = ("rows",)
    gives = "batch"

    def __init__(self, microbatch_size: int, pad_id: int = 0, parallelism: int | None = None):
        super().__init__(parallelism)
        if not isinstance(microbatch_size, int) or microbatch_size < 1:
            raise ValueError(f"batch(microbatch_size={microbatch_size!r}): must be an int >= 1")
        self.microbatch_size, self.pad_id = microbatch_size, int(pad_id)

    def params(self) -> dict:
        return {"microbatch_size": self.microbatch_size}

    def accumulator(self, lane: int, window: int) -> Accumulator:
        return BatchAccumulator(self.microbatch_size)

    def work(self, unit: tuple[list, int]) -> Rows:
        refs, padding = unit
        rows = gather(refs)
        if padding:
            rows = Rows.concat([rows, Rows.padding(padding, rows.tokens.shape[1], self.pad_id)])
        return rows


class BatchAccumulator(Accumulator):
    def __init__(self, size: int):
        self.size = size
        self.pending: list[tuple[object, int]] = []

    def push(self, rows) -> list:
        out = []
        for i in range(len(rows)):
            self.pending.append((rows, i))
            if len(self.pending) == self.size:
                out.append((self.pending, 0))
                self.pending = []
        return out

    def flush(self) -> list:
        if not self.pending:
            return []
        out = [(self.pending, self.size - len(self.pending))]
        self.pending = []
        return out
