"""batch: a window's rows -> microbatches of ``microbatch_size`` rows.

Windows hold a whole number of microbatches, so every microbatch is full; only the last one of
a lane whose dataset stopped is filled up with padding rows (labels all -100), each one
document for attention (positions 0 .. row_len - 1), so that they hold no more documents than
``pack_flat(max_documents_per_row=...)`` allows.
"""

from __future__ import annotations

import numpy as np

from zephon.ops.base import Operator
from zephon.ops.containers import Rows


class BatchRows(Operator):
    kind = "batch"
    takes = ("rows",)
    gives = "batch"

    def __init__(self, microbatch_size: int, pad_id: int = 0):
        if not isinstance(microbatch_size, int) or isinstance(microbatch_size, bool) or microbatch_size < 1:
            raise ValueError(f"batch(microbatch_size={microbatch_size!r}): must be an int >= 1")
        self.microbatch_size, self.pad_id = microbatch_size, int(pad_id)

    def params(self) -> dict:
        return {"microbatch_size": self.microbatch_size}

    def split(self, rows: Rows) -> list[Rows]:
        size, n = self.microbatch_size, len(rows)
        short = -n % size
        if short:
            padding = Rows.padding(short, rows.tokens.shape[1], self.pad_id)
            padding.positions[:] = np.arange(rows.tokens.shape[1], dtype=np.int32)
            rows = Rows.concat([rows, padding])
        return [rows.slice(a, a + size) for a in range(0, n, size)]
