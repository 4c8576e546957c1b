"""shuffle: the rows of each window in a seeded order, through a buffer of ``buffer_size`` rows.

Rows enter the buffer in packing order; once it is full, each new row swaps out a random one,
and at the window's end the rest leave in a random order. With the default window (the buffer
rounded up to whole microbatches) that is a full permutation of each window. The random stream
is seeded by ``(seed, lane, window)``, so a window's order is a pure function of the recipe and
replaying a window after a restore gives the same order.
"""

from __future__ import annotations

import numpy as np

from zephon.ops.base import Operator
from zephon.work.plan import seed_sequence


class Shuffle(Operator):
    kind = "shuffle"
    takes = ("rows",)
    gives = None

    def __init__(self, buffer_size: int, seed: int = 0):
        if not isinstance(buffer_size, int) or isinstance(buffer_size, bool) or buffer_size < 1:
            raise ValueError(f"shuffle(buffer_size={buffer_size!r}): must be an int >= 1")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"shuffle(seed={seed!r}): must be an int >= 0")
        self.buffer_size, self.seed = buffer_size, int(seed)

    def params(self) -> dict:
        return {"buffer_size": self.buffer_size, "seed": self.seed}

    def order(self, n: int, lane: int, window: int) -> np.ndarray:
        """The order in which a window's ``n`` rows leave the buffer."""
        rng = np.random.default_rng(seed_sequence(self.seed, "shuffle", lane, window))
        size = self.buffer_size
        if n <= size:
            return rng.permutation(n)
        buffer, out = list(range(size)), []
        for i in range(size, n):
            j = int(rng.integers(size))
            out.append(buffer[j])
            buffer[j] = i
        out += [buffer[i] for i in rng.permutation(size)]
        return np.asarray(out, np.int64)
