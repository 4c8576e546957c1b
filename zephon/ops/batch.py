"""batch: a window's rows -> microbatches of ``microbatch_size`` rows.

Windows hold a whole number of microbatches, so every microbatch is full; only the last one of
a lane whose dataset stopped is filled up with padding rows (labels all -100), each one
document for attention (positions 0 .. row_len - 1), so that they hold no more documents than
``pack_flat(max_documents_per_row=...)`` allows.

With ``balance_attention`` a window's rows are first put in an order whose running attention
cost tracks the window's mean (zephon.ops.balance), so that microbatches and the steps of a
lane cost about the same.
"""

from __future__ import annotations

import numpy as np

from zephon.ops.balance import attention_cost, balanced_order
from zephon.ops.base import Operator
from zephon.ops.containers import Rows


class BatchRows(Operator):
    kind = "batch"
    takes = ("rows",)
    gives = "batch"

    def __init__(self, microbatch_size: int, pad_id: int = 0, balance_attention: bool = False):
        if not isinstance(microbatch_size, int) or isinstance(microbatch_size, bool) or microbatch_size < 1:
            raise ValueError(f"batch(microbatch_size={microbatch_size!r}): must be an int >= 1")
        if not isinstance(balance_attention, bool):
            raise ValueError(f"batch(balance_attention={balance_attention!r}): must be True or False")
        self.microbatch_size, self.pad_id = microbatch_size, int(pad_id)
        self.balance_attention = balance_attention

    def params(self) -> dict:
        out = {"microbatch_size": self.microbatch_size}
        if self.balance_attention:  # only where set: fingerprints of recipes without it stay
            out["balance_attention"] = True
        return out

    def split(self, rows: Rows) -> list[Rows]:
        if self.balance_attention and len(rows) > 1:
            rows = rows.take(balanced_order(attention_cost(rows.positions)))
        size, n = self.microbatch_size, len(rows)
        short = -n % size
        if short:
            padding = Rows.padding(short, rows.tokens.shape[1], self.pad_id)
            padding.positions[:] = np.arange(rows.tokens.shape[1], dtype=np.int32)
            rows = Rows.concat([rows, padding])
        return [rows.slice(a, a + size) for a in range(0, n, size)]
