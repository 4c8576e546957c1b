"""Pure planning: which chunk of a dataset a lane takes next.

Each epoch of a dataset is a seeded permutation of its chunks. The epochs laid end to end form
one sequence, and lane ``l`` of ``L`` takes positions ``l, l + L, l + 2L, ...`` of it. So within an
epoch every chunk goes to exactly one lane, every lane gets its share even when the chunk count is
not a multiple of ``L``, and the k-th chunk of a lane is known in O(1) from ``(seed, L, l, k)``.
"""

from __future__ import annotations

import threading
import zlib

import numpy as np


def seed_sequence(*parts: int | str) -> np.random.SeedSequence:
    """A SeedSequence from ints and strings (strings hashed stably, not with ``hash()``)."""
    words = [zlib.crc32(p.encode()) if isinstance(p, str) else int(p) for p in parts]
    return np.random.SeedSequence(words)


class ChunkDealer:
    """Deals one dataset's chunks to lanes, epoch after epoch."""

    def __init__(self, name: str, num_chunks: int, seed: int, num_lanes: int, repeat: bool):
        self.name, self.num_chunks, self.seed = name, num_chunks, seed
        self.num_lanes, self.repeat = num_lanes, repeat
        self._epochs: dict[int, np.ndarray] = {}  # lanes share a dealer: a few epochs at a time
        self._lock = threading.Lock()

    def permutation(self, epoch: int) -> np.ndarray:
        with self._lock:
            perm = self._epochs.get(epoch)
            if perm is None:
                rng = np.random.default_rng(seed_sequence(self.seed, self.name, epoch))
                perm = rng.permutation(self.num_chunks)
                # the same values in half the memory (4 bytes a chunk) where they fit
                perm = self._epochs[epoch] = perm.astype(np.int32) if self.num_chunks < 1 << 31 else perm
                for old in sorted(self._epochs)[:-4]:
                    del self._epochs[old]
            return perm

    def chunk_index(self, lane: int, k: int) -> int | None:
        """Index of the lane's k-th chunk, or None once a non-repeating dataset is used up."""
        position = k * self.num_lanes + lane
        epoch, offset = divmod(position, self.num_chunks)
        if epoch > 0 and not self.repeat:
            return None
        return int(self.permutation(epoch)[offset])
