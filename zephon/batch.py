"""`Batch`: one microbatch of one lane, with what a training step needs and a digest."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

IGNORE_INDEX = -100


@dataclass(slots=True)
class Batch:
    """``microbatch_size`` packed rows of ``max_length + 1`` tokens, from lane ``lane``.

    ``index`` is the batch's position in its lane's stream: it starts at 0 and keeps counting
    across checkpoint and restore. ``sources`` is each token's dataset index (-1 on padding);
    ``starts`` marks the first token of each document (a row may also begin inside one).
    """

    lane: int
    index: int
    tokens: np.ndarray  # int32 [B, max_length + 1]
    positions: np.ndarray  # int32 [B, max_length + 1]
    sources: np.ndarray  # int16 [B, max_length + 1]
    starts: np.ndarray | None = None  # bool [B, max_length + 1]: each document's first token
    counters: dict[str, int] = field(default_factory=dict)

    def to_training(self) -> dict[str, np.ndarray]:
        """``input_ids``, ``labels`` (next tokens, -100 on padding), ``positions``: int64 [B, L]."""
        labels = self.tokens[:, 1:].astype(np.int64)
        labels[self.sources[:, 1:] < 0] = IGNORE_INDEX
        return {
            "input_ids": self.tokens[:, :-1].astype(np.int64),
            "labels": labels,
            "positions": self.positions[:, :-1].astype(np.int64),
        }

    def source_spans(self, row: int) -> list[tuple[int, int, int]]:
        """Provenance of one packed row: ``(dataset index, start, stop)`` for each run of tokens
        from one dataset, padding (-1) included; indices into ``Pipeline.dataset_names``."""
        src = self.sources[row]
        edges = np.flatnonzero(np.diff(src)) + 1
        starts = np.concatenate([[0], edges])
        stops = np.concatenate([edges, [len(src)]])
        return [(int(src[a]), int(a), int(b)) for a, b in zip(starts, stops, strict=True)]

    def tokens_per_dataset(self, num_datasets: int) -> np.ndarray:
        """Delivered tokens of each dataset in this batch (padding excluded)."""
        src = self.sources[self.sources >= 0]
        return np.bincount(src, minlength=num_datasets)

    def documents_per_dataset(self, num_datasets: int) -> np.ndarray:
        """Documents of each dataset that begin in this batch: what record ratios count."""
        if self.starts is None:
            return np.zeros(num_datasets, np.int64)
        return np.bincount(self.sources[self.starts], minlength=num_datasets)

    def digest(self) -> str:
        """SHA-256 of the lane, the index and the token, position and source arrays."""
        h = hashlib.sha256(f"{self.lane}:{self.index}:{self.tokens.shape}".encode())
        for array in (self.tokens, self.positions, self.sources):
            h.update(np.ascontiguousarray(array).tobytes())
        return h.hexdigest()


def global_step_digest(batches: list[Batch] | list[tuple[int, int, str]]) -> str:
    """SHA-256 of a global step: its batches' digests in (lane, index) order.

    Takes batches, or ``(lane, index, digest)`` triples gathered from several ranks.
    """
    triples = [(b.lane, b.index, b.digest()) if isinstance(b, Batch) else tuple(b) for b in batches]
    keys = [(lane, index) for lane, index, _ in triples]
    if len(set(keys)) != len(keys):
        raise ValueError("a global step holds the same (lane, index) twice")
    h = hashlib.sha256()
    for _, _, digest in sorted(triples):
        h.update(bytes.fromhex(digest))
    return h.hexdigest()


def batches_per_lane(global_batch_size: int, num_lanes: int, microbatch_size: int) -> int:
    """How many batches each lane gives to one global step of ``global_batch_size`` sequences."""
    per_step = num_lanes * microbatch_size
    if global_batch_size <= 0 or global_batch_size % per_step:
        raise ValueError(
            f"a global batch of {global_batch_size} sequences does not split evenly over "
            f"{num_lanes} lanes x microbatch_size {microbatch_size} = {per_step}: make the "
            f"global batch a multiple of {per_step}, or change num_lanes or microbatch_size"
        )
    return global_batch_size // per_step
