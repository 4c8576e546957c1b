"""The data that flows through a lane, as numpy arrays, never Python lists of tokens:
``RecordBlock`` (the records of one chunk) -> ``Docs`` (its documents as one flat token array)
-> ``Rows`` (packed rows of a window).

Image-text data adds ``Patches``: every image token (a placeholder id in the token stream) carries
one patch of pixels, so images travel with their tokens however rows are cut, shuffled or batched.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field

import numpy as np

PAD_SOURCE = -1  # the `sources` value of padding tokens
HUGE_FROM = 4 << 20  # numpy asks the kernel for huge pages (MADV_HUGEPAGE) from this size on


def fresh(shape: int | tuple[int, ...], dtype) -> np.ndarray:
    """``np.empty(shape, dtype)``, but where numpy would ask the kernel for huge pages
    (``MADV_HUGEPAGE``, from 4 MiB), memory of ordinary pages of its own. A window's patches
    (12-24 MiB of pixels, written once, read once, freed) went to memory numpy marks so; in a
    running pipeline, other threads allocating and freeing beside the lane, their first touch
    cost up to 6 ms a MiB: 2 MiB pages zeroed at once, or memory compacted to find them where
    ``transparent_hugepage/defrag`` is ``madvise`` (numpy issue 31590). Measured here (Figure 3's
    process torch x2, 400k tokens, three interleaved pairs, 2 cores): copying the windows' patches
    took 0.23-0.24 s of CPU against 1.1-1.4 s, the whole run 8.2-9.1 s against 9.3-11.0. A process
    doing nothing else copies faster into numpy's memory, which it reuses (4-8 ms for 19 MiB
    against 16-18 ms, the small pages' first touch)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    if count * dtype.itemsize < HUGE_FROM or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.empty(shape, dtype)
    # private and anonymous, as malloc's own, but without numpy's MADV_HUGEPAGE
    memory = mmap.mmap(-1, count * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(memory, dtype, count).reshape(shape)


@dataclass(slots=True)
class RecordBlock:
    """The records of one chunk of dataset ``dataset``; ``numbers``: each one's place among the
    chunk's records (filters and skipped records leave gaps). ``skip_bad``: the dataset skips
    bad records (``on_error="skip"``) instead of raising; ``skipped``: those skipped so far, as
    (place in the chunk, why)."""

    dataset: int
    records: list[dict]
    numbers: np.ndarray  # int64 [n]
    counters: dict[str, int] = field(default_factory=dict)
    skip_bad: bool = False
    skipped: list[tuple[int, str]] = field(default_factory=list)
    digest: str = ""  # of the bytes the chunk was read from (zephon.io.formats.content_digest)
    requests: tuple[int, int] = (0, 0)  # what reading it cost the store: requests, bytes

    def without(self, bad: dict[int, str], counters: dict[str, int] | None = None) -> RecordBlock:
        """This block less the records at positions ``bad`` (position: why), counted as skipped."""
        keep = np.ones(len(self.records), bool)
        keep[list(bad)] = False
        counters = dict(self.counters if counters is None else counters)
        counters["skipped_records"] = counters.get("skipped_records", 0) + len(bad)
        skipped = self.skipped + [(int(self.numbers[i]), why) for i, why in bad.items()]
        records = [r for r, k in zip(self.records, keep, strict=True) if k]
        return RecordBlock(
            self.dataset,
            records,
            self.numbers[keep],
            counters,
            self.skip_bad,
            skipped,
            self.digest,
            self.requests,
        )

    def __len__(self) -> int:
        return len(self.records)


@dataclass(slots=True)
class Patches:
    """The pixels of image tokens, one patch per token, in token order: ``pixels[i]`` is a patch
    of ``patch x patch x 3`` uint8 values; ``grid[i]`` is (its index in its image, the image's
    grid height, grid width) in patches, so an image cut across rows can still be placed."""

    pixels: np.ndarray  # uint8 [P, patch * patch * 3]
    grid: np.ndarray  # int32 [P, 3]

    def __len__(self) -> int:
        return len(self.pixels)

    def slice(self, start: int, stop: int) -> Patches:
        return Patches(self.pixels[start:stop], self.grid[start:stop])

    @staticmethod
    def concat(items: list[Patches], patch_dim: int) -> Patches:
        if not items:
            return Patches.empty(patch_dim)
        pixels = fresh((sum(len(p) for p in items), patch_dim), np.uint8)
        np.concatenate([p.pixels for p in items], out=pixels)
        return Patches(pixels, np.concatenate([p.grid for p in items]))

    @staticmethod
    def empty(patch_dim: int) -> Patches:
        return Patches(np.zeros((0, patch_dim), np.uint8), np.zeros((0, 3), np.int32))


@dataclass(slots=True)
class Docs:
    """A chunk's documents as one flat token array: document i is ``tokens[offsets[i]:offsets[i+1]]``,
    made of record ``records[i]`` of the chunk; no document is empty. ``counters``: what was left
    out on the way (empty documents, filtered records)."""

    tokens: np.ndarray  # int32 [total]
    offsets: np.ndarray  # int64 [n + 1]
    records: np.ndarray  # int64 [n]
    dataset: int
    counters: dict[str, int] = field(default_factory=dict)
    skipped: list[tuple[int, str]] = field(default_factory=list)  # as RecordBlock's
    patches: Patches | None = None  # image-text data: the patch of each image token
    patch_at: np.ndarray | None = None  # int64 [total + 1]: image tokens before each token
    digest: str = ""  # of the bytes its chunk was read from, as the read gave it
    requests: tuple[int, int] = (0, 0)  # what reading its chunk cost the store: requests, bytes
    positions: np.ndarray | None = None  # int32 [total]: each token's place in its document

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def nbytes(self) -> int:
        """The memory its arrays hold."""
        arrays = [self.tokens, self.offsets, self.records, self.patch_at, self.positions]
        if self.patches is not None:
            arrays += [self.patches.pixels, self.patches.grid]
        return sum(a.nbytes for a in arrays if a is not None)

    def token_positions(self) -> np.ndarray:
        """Each token's place in its document (0 at every document start): made once per chunk,
        by the worker that tokenized it, so that packing only copies slices of it."""
        if self.positions is None:
            starts = np.repeat(self.offsets[:-1].astype(np.int32), np.diff(self.offsets))
            self.positions = np.arange(len(self.tokens), dtype=np.int32) - starts
        return self.positions

    def patches_of(self, start: int, stop: int) -> tuple[np.ndarray, Patches] | None:
        """Tokens ``[start, stop)``: which are image tokens (bool), and their patches; None for
        documents without images."""
        if self.patches is None:
            return None
        at = self.patch_at[start : stop + 1]
        return np.diff(at) > 0, self.patches.slice(int(at[0]), int(at[-1]))


@dataclass(slots=True)
class Rows:
    """Packed rows of ``row_len`` tokens; ``sources``: each token's dataset, -1 on padding;
    ``starts``: the first token of each document (not where a document continues after a cut)."""

    tokens: np.ndarray  # int32 [n, row_len]
    positions: np.ndarray  # int32 [n, row_len]
    sources: np.ndarray  # int16 [n, row_len]
    starts: np.ndarray  # bool [n, row_len]
    vision: RowPatches | None = None  # image-text data

    FIELDS = ("tokens", "positions", "sources", "starts")

    def __len__(self) -> int:
        return len(self.tokens)

    def slice(self, start: int, stop: int) -> Rows:
        vision = self.vision.rows(start, min(stop, len(self))) if self.vision else None
        return Rows(*(getattr(self, f)[start:stop] for f in self.FIELDS), vision)

    def take(self, order: np.ndarray) -> Rows:
        vision = self.vision.take(order) if self.vision else None
        return Rows(*(getattr(self, f)[order] for f in self.FIELDS), vision)

    @staticmethod
    def concat(items: list[Rows]) -> Rows:
        arrays = (np.concatenate([getattr(r, f) for r in items]) for f in Rows.FIELDS)
        visions = [r.vision for r in items]
        if all(v is None for v in visions):
            return Rows(*arrays)
        dim = next(v.patches.pixels.shape[1] for v in visions if v is not None)
        visions = [RowPatches.none(len(r), r.tokens.shape[1], dim) if v is None else v
                   for r, v in zip(items, visions, strict=True)]  # fmt: skip
        return Rows(*arrays, RowPatches.concat(visions))

    @staticmethod
    def padding(n: int, row_len: int, pad_id: int) -> Rows:
        return Rows(
            np.full((n, row_len), pad_id, np.int32),
            np.zeros((n, row_len), np.int32),
            np.full((n, row_len), PAD_SOURCE, np.int16),
            np.zeros((n, row_len), bool),
        )


@dataclass(slots=True)
class RowPatches:
    """The image tokens of packed rows: ``mask`` marks them, and row ``r``'s patches, in token
    order, are ``patches[offsets[r]:offsets[r + 1]]``."""

    mask: np.ndarray  # bool [n, row_len]
    patches: Patches
    offsets: np.ndarray  # int64 [n + 1]

    def row(self, r: int) -> Patches:
        return self.patches.slice(int(self.offsets[r]), int(self.offsets[r + 1]))

    def rows(self, start: int, stop: int) -> RowPatches:
        """Rows ``[start, stop)``: views, no copy of the pixels."""
        a, b = int(self.offsets[start]), int(self.offsets[stop])
        return RowPatches(self.mask[start:stop], self.patches.slice(a, b), self.offsets[start : stop + 1] - a)

    def take(self, order) -> RowPatches:
        order = np.asarray(order, np.int64)
        dim = self.patches.pixels.shape[1]
        return RowPatches.of(self.mask[order], Patches.concat([self.row(int(r)) for r in order], dim))

    @staticmethod
    def of(mask: np.ndarray, patches: Patches) -> RowPatches:
        offsets = np.zeros(len(mask) + 1, np.int64)
        np.cumsum(mask.sum(axis=1), out=offsets[1:])
        return RowPatches(mask, patches, offsets)

    @staticmethod
    def concat(items: list[RowPatches]) -> RowPatches:
        dim = items[0].patches.pixels.shape[1]
        mask = np.concatenate([v.mask for v in items])
        return RowPatches.of(mask, Patches.concat([v.patches for v in items], dim))

    @staticmethod
    def none(n: int, row_len: int, patch_dim: int) -> RowPatches:
        return RowPatches(np.zeros((n, row_len), bool), Patches.empty(patch_dim), np.zeros(n + 1, np.int64))
