"""`Batch`: one microbatch of one lane, with what a training step needs and a digest."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from zephon.ops.containers import RowPatches

try:  # the counts compiled (setup.py): the same as the two methods below, in one pass
    from zephon.ops._rows import count_by_dataset as _count_by_dataset
except ImportError:  # not built (no C compiler at install)
    _count_by_dataset = None

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
    vision: RowPatches | None = None  # image-text data: image tokens and their patches
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # (mean, std) per channel

    @property
    def nbytes(self) -> int:
        """The memory the batch's arrays hold."""
        arrays = [self.tokens, self.positions, self.sources, self.starts]
        if self.vision is not None:
            arrays += [self.vision.mask, self.vision.patches.pixels, self.vision.patches.grid]
        return sum(a.nbytes for a in arrays if a is not None)

    def to_training(self) -> dict[str, np.ndarray]:
        """``input_ids``, ``labels`` (next tokens, -100 on padding), ``positions``: int64 [B, L].

        Image-text batches add ``image_mask`` (bool [B, L]: the inputs that are image tokens),
        ``pixel_values`` (float32 [P, patch, patch, 3], normalized: one patch per image token of
        ``input_ids``, in row-major order) and ``image_spans`` (int64 [S, 6]: row, first position,
        tokens, index of its first patch in its image, grid height, grid width, for each run of
        one image's tokens in a row); labels are -100 where the next token is an image token.
        """
        labels = self.tokens[:, 1:].astype(np.int64)
        labels[self.sources[:, 1:] < 0] = IGNORE_INDEX
        out = {
            "input_ids": self.tokens[:, :-1].astype(np.int64),
            "labels": labels,
            "positions": self.positions[:, :-1].astype(np.int64),
        }
        if self.vision is not None:
            labels[self.vision.mask[:, 1:]] = IGNORE_INDEX
            out.update(vision_inputs(self.vision, self.normalize))
        return out

    def source_spans(self, row: int) -> list[tuple[int, int, int]]:
        """Provenance of one packed row: ``(dataset index, start, stop)`` for each run of tokens
        from one dataset, padding (-1) included; indices into ``Pipeline.dataset_names``."""
        src = self.sources[row]
        edges = np.flatnonzero(np.diff(src)) + 1
        starts = np.concatenate([[0], edges])
        stops = np.concatenate([edges, [len(src)]])
        return [(int(src[a]), int(a), int(b)) for a, b in zip(starts, stops, strict=True)]

    def counts_per_dataset(self, num_datasets: int) -> tuple[np.ndarray, np.ndarray]:
        """``tokens_per_dataset`` and ``documents_per_dataset`` in one pass: compiled
        (``zephon/ops/_rows.c``, the same counts) where it was built. The delivery counts every
        batch: numpy's passes were a tenth of the lane's own work."""
        if _count_by_dataset is None:
            return self.tokens_per_dataset(num_datasets), self.documents_per_dataset(num_datasets)
        tokens, documents = np.zeros(num_datasets, np.int64), np.zeros(num_datasets, np.int64)
        starts = None if self.starts is None else np.ascontiguousarray(self.starts)
        _count_by_dataset(np.ascontiguousarray(self.sources), starts, tokens, documents)
        return tokens, documents

    def tokens_per_dataset(self, num_datasets: int) -> np.ndarray:
        """Delivered tokens of each dataset in this batch (padding excluded)."""
        if num_datasets <= 8:  # a pass per dataset: a tenth of the time of a boolean index and bincount
            return np.array([np.count_nonzero(self.sources == d) for d in range(num_datasets)], np.int64)
        return np.bincount(self.sources.ravel().astype(np.intp) + 1, minlength=num_datasets + 1)[1:]

    def documents_per_dataset(self, num_datasets: int) -> np.ndarray:
        """Documents of each dataset that begin in this batch: what record ratios count."""
        if self.starts is None:
            return np.zeros(num_datasets, np.int64)
        return np.bincount(self.sources[self.starts], minlength=num_datasets)

    def digest(self) -> str:
        """SHA-256 of the lane, the index and the token, position and source arrays (and for
        image-text data the image tokens, their pixels and places in their images)."""
        h = hashlib.sha256(f"{self.lane}:{self.index}:{self.tokens.shape}".encode())
        arrays = [self.tokens, self.positions, self.sources]
        if self.vision is not None:
            arrays += [self.vision.mask, self.vision.patches.pixels, self.vision.patches.grid]
        for array in arrays:
            h.update(np.ascontiguousarray(array).tobytes())
        return h.hexdigest()


def vision_inputs(vision: RowPatches, normalize) -> dict[str, np.ndarray]:
    """What a model needs of a batch's images, for its inputs (a row's last token is only a label)."""
    mask = vision.mask
    rows, cols = np.nonzero(mask)  # row-major: the order of the patches
    keep = cols < mask.shape[1] - 1
    pixels, grid = vision.patches.pixels[keep], vision.patches.grid[keep]
    rows, cols = rows[keep], cols[keep]
    side = round((pixels.shape[1] // 3) ** 0.5)
    # one float array, scaled and normalized in place: the same values as ``(x / 255.0 - mean) / std``,
    # operation for operation, without three more arrays of its size, each memory the kernel faults
    # in anew (Figure 3's batches, 47 MiB of float pixels: 80-89 -> 57-63 ms a batch, inline runner;
    # 142-182 -> 91-117 ms, two process workers decoding beside it; medians of 40-60 batches)
    values = pixels.reshape(-1, side, side, 3).astype(np.float32)
    values /= 255.0
    if normalize is not None:
        mean, std = (np.asarray(v, np.float32) for v in normalize)
        values -= mean
        values /= std
    # a span starts where the row, the column run or the image changes
    new = np.ones(len(rows), bool)
    new[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1] + 1) | (grid[1:, 0] != grid[:-1, 0] + 1)
    first = np.flatnonzero(new)
    count = np.diff(np.append(first, len(rows)))
    spans = np.stack([rows[first], cols[first], count, grid[first, 0], grid[first, 1], grid[first, 2]], 1)
    return {
        "image_mask": mask[:, :-1].copy(),
        "pixel_values": values,
        "image_spans": spans.astype(np.int64).reshape(-1, 6),
    }


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
