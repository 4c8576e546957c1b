"""shuffle: a seeded buffer per lane, refilled as items arrive; emptied at every flush.

The random stream is seeded by ``(seed, lane, window)``, so a window's order is a pure function
of the recipe and replaying a window after a restore gives the same order.
"""

from __future__ import annotations

import numpy as np

from zephon.ops.base import Accumulator, Operator
from zephon.ops.containers import gather
from zephon.work.plan import seed_sequence


class Shuffle(Operator):
    kind = "shuffle"
    takes = ("docs", "rows")
    gives = None

    def __init__(self, buffer_size: int, seed: int = 0, parallelism: int | None = None):
        super().__init__(parallelism)
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"shuffle(buffer_size={buffer_size!r}): must be an int >= 1")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"shuffle(seed={seed!r}): must be an int >= 0")
        self.buffer_size, self.seed = buffer_size, int(seed)

    def params(self) -> dict:
        return {"buffer_size": self.buffer_size, "seed": self.seed}

    def accumulator(self, lane: int, window: int) -> Accumulator:
        rng = np.random.default_rng(seed_sequence(self.seed, "shuffle", lane, window))
        return ShuffleAccumulator(self.buffer_size, rng)

    def work(self, refs: list) -> object:
        return gather(refs)


class ShuffleAccumulator(Accumulator):
    def __init__(self, buffer_size: int, rng: np.random.Generator):
        self.buffer_size, self.rng = buffer_size, rng
        self.buffer: list[tuple[object, int]] = []

    def push(self, container) -> list:
        out = []
        for i in range(len(container)):
            if len(self.buffer) < self.buffer_size:
                self.buffer.append((container, i))
                continue
            j = int(self.rng.integers(self.buffer_size))
            out.append(self.buffer[j])
            self.buffer[j] = (container, i)
        return [out] if out else []

    def flush(self) -> list:
        if not self.buffer:
            return []
        order = self.rng.permutation(len(self.buffer))
        out, self.buffer = [self.buffer[i] for i in order], []
        return [out]
