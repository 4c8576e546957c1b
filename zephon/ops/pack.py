"""pack_flat: the lane's documents -> a window of rows of ``max_length + 1`` tokens.

The packer asks the mixer for pieces and fills exactly the rows of one window; the next window
starts at the exact token where this one stopped, so nothing is padded and nothing is dropped
(except the last row of a lane whose dataset stopped).

``wrap`` fills rows end to end: a document that does not fit in what is left of a row is cut at
the row's end, and its rest starts a later row. ``best_fit`` keeps documents whole (cutting only
those longer than a row) and packs a window's documents best-fit decreasing into its rows: it
takes the longest prefix of the lane's documents that fits the window's rows, then best-fit
places the documents that follow until one fits nowhere. Rows may end in padding, but no row is
empty.

``positions`` restart at 0 at every document start and wherever a document was cut (a row that
begins inside a document, a piece of an overlong one), so that attention can be masked per
document and rotary positions stay below the row length. This is what TorchTitan's masks need:
they find documents where positions are 0 (``get_document_mask_mod``, varlen ``cu_seqlens``), so
a cut document's rest is a document of its own in the next row, attending only to itself, from
position 0, as TorchTitan's own loader gives it. With ``document_mask=False`` positions count the
whole row instead (0 .. row_len - 1): one document per row for attention and rotary positions.

``max_documents_per_row`` bounds the pieces (documents, and rests of cut documents) of a row, for
kernels that need a bound: a row is closed once it holds that many, and the rest of it is
padding, whose positions go on from its last piece so that padding adds no document. Wrap then
takes one document at a time, and best-fit opens no bin past the bound.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np

from zephon.ops.base import Operator
from zephon.ops.containers import Patches, RowPatches, Rows
from zephon.work.mixture import Mixer, Piece

try:  # laying pieces end to end, compiled (setup.py): the same values as laid_end_to_end's Python
    from zephon.ops._rows import gather as _gather
except ImportError:  # not built (no C compiler at install)
    _gather = None

ALGORITHMS = ("wrap", "best_fit")


class PackFlat(Operator):
    kind = "pack_flat"
    takes = ("docs",)
    gives = "rows"

    def __init__(
        self,
        max_length: int,
        algorithm: str = "wrap",
        pad_id: int = 0,
        document_mask: bool = True,
        max_documents_per_row: int | None = None,
    ):
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
            raise ValueError(f"pack_flat(max_length={max_length!r}): must be an int >= 1")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"pack_flat(algorithm={algorithm!r}): expected one of {ALGORITHMS}")
        if not isinstance(document_mask, bool):
            raise ValueError(f"pack_flat(document_mask={document_mask!r}): must be True or False")
        most = max_documents_per_row
        if most is not None and (not isinstance(most, int) or isinstance(most, bool) or most < 1):
            raise ValueError(f"pack_flat(max_documents_per_row={most!r}): must be an int >= 1, or None")
        if most is not None and not document_mask:
            raise ValueError(
                "pack_flat(max_documents_per_row=...) bounds the documents attention sees in a row; "
                "with document_mask=False a row is one document: drop one of the two"
            )
        self.max_length, self.algorithm, self.pad_id = max_length, algorithm, int(pad_id)
        self.document_mask, self.max_documents_per_row = document_mask, most

    @property
    def row_len(self) -> int:
        return self.max_length + 1  # input_ids = row[:-1], labels = row[1:]

    @property
    def pads(self) -> bool:
        """Whether rows before a lane's end may end in padding."""
        return self.algorithm != "wrap" or self.max_documents_per_row is not None

    def params(self) -> dict:
        out = {"max_length": self.max_length, "algorithm": self.algorithm, "pad_id": self.pad_id}
        if not self.document_mask:  # only where set: fingerprints of recipes without them stay
            out["document_mask"] = False
        if self.max_documents_per_row is not None:
            out["max_documents_per_row"] = self.max_documents_per_row
        return out

    def fill(self, mixer: Mixer, rows: int, order: Callable[[int], np.ndarray] | None = None) -> Rows:
        """The next window: ``rows`` rows, fewer only once the mixer has ended; with ``order``
        (the number of rows -> a permutation, the shuffle's), row ``i`` is packed row ``order[i]``."""
        most = self.max_documents_per_row
        if self.algorithm == "wrap":
            pieces, lengths = wrap(mixer, rows, self.row_len, most)
            bins = by_row(pieces, lengths)
        else:
            bins = best_fit(mixer, rows, self.row_len, most)
            lengths = [sum(len(p) for p in b) for b in bins]
        permutation = None if order is None else order(len(bins))
        out = build_rows(bins, lengths, self.row_len, self.pad_id, permutation)
        if permutation is not None:
            lengths = [lengths[r] for r in permutation.tolist()]
        if not self.document_mask:
            out.positions[:] = np.arange(self.row_len, dtype=np.int32)
        elif most is not None:
            continue_into_padding(out.positions, lengths)
        return out


def by_row(pieces: list[Piece], lengths: list[int]) -> list[list[Piece]]:
    """Pieces laid end to end (none crosses a row's end), grouped into rows of ``lengths``."""
    bins, at = [], 0
    for n in lengths:
        row, filled = [], 0
        while filled < n:
            piece = pieces[at]
            row.append(piece)
            filled, at = filled + piece.stop - piece.start, at + 1
        bins.append(row)
    return bins


def continue_into_padding(positions: np.ndarray, lengths: list[int]) -> None:
    """Padding after a row's last piece continues its positions (an empty row counts from 0)."""
    row_len = positions.shape[1]
    for r, n in enumerate(lengths):
        if n < row_len:
            first = positions[r, n - 1] + 1 if n else 0
            positions[r, n:] = np.arange(first, first + row_len - n, dtype=np.int32)


def wrap(mixer: Mixer, rows: int, row_len: int, most: int | None = None) -> tuple[list[Piece], list[int]]:
    """Pieces that fill ``rows`` rows end to end, and the tokens in each row; with ``most``, a
    row is closed at ``most`` pieces."""
    if most is not None:
        return _wrap_bounded(mixer, rows, row_len, most)
    pieces: list[Piece] = []
    filled = mixer.fill(pieces, 0, rows * row_len, row_len)
    lengths = [row_len] * (filled // row_len) + ([filled % row_len] if filled % row_len else [])
    return pieces, lengths


def _wrap_bounded(mixer: Mixer, rows: int, row_len: int, most: int) -> tuple[list[Piece], list[int]]:
    pieces, lengths = [], []
    while len(lengths) < rows:
        filled = count = 0
        while filled < row_len and count < most:
            piece = mixer.take(row_len - filled)  # one document at a time: each piece is counted
            if piece is None:
                return pieces, lengths + ([filled] if filled else [])
            pieces.append(piece)
            filled, count = filled + len(piece), count + 1
        lengths.append(filled)
    return pieces, lengths


def best_fit(mixer: Mixer, rows: int, row_len: int, most: int | None = None) -> list[list[Piece]]:
    """Pieces packed into at most ``rows`` rows (exactly ``rows`` unless the mixer ended), at
    most ``most`` pieces a row if given."""
    most = most or row_len  # a piece holds at least one token
    pieces, snapshots, total = [], [], 0
    while True:  # the longest prefix whose tokens fit the window
        snapshot = mixer.snapshot()
        piece = mixer.take(row_len)
        if piece is None:
            break
        if total + len(piece) > rows * row_len:
            mixer.restore(snapshot)
            break
        pieces.append(piece)
        snapshots.append(snapshot)
        total += len(piece)
    lengths = [len(p) for p in pieces]
    bins = decreasing(lengths, row_len, most)
    if len(bins) > rows:  # fragmentation: the longest prefix that does fit
        lo, hi = 0, len(pieces)  # bins(lo) <= rows < bins(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if len(decreasing(lengths[:mid], row_len, most)) <= rows else (lo, mid)
        mixer.restore(snapshots[lo])
        pieces = pieces[:lo]
        bins = decreasing(lengths[:lo], row_len, most)
    out = [[pieces[i] for i in b] for b in bins]
    free = sorted((row_len - sum(len(p) for p in b), r) for r, b in enumerate(out) if len(b) < most)
    while True:  # then best fit for the documents that follow, until one fits nowhere
        snapshot = mixer.snapshot()
        piece = mixer.take(row_len)
        if piece is None:
            break
        at = bisect.bisect_left(free, (len(piece), -1))
        if at < len(free):
            space, r = free.pop(at)
            out[r].append(piece)
            if len(out[r]) < most:
                bisect.insort(free, (space - len(piece), r))
        elif len(out) < rows:
            out.append([piece])
            if most > 1:
                bisect.insort(free, (row_len - len(piece), len(out) - 1))
        else:
            mixer.restore(snapshot)
            break
    return out


def decreasing(lengths: list[int], row_len: int, most: int | None = None) -> list[list[int]]:
    """Best-fit decreasing: item indices per bin, bins in the order they were opened; a bin
    holds at most ``most`` items if given."""
    most = most or max(len(lengths), 1)
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (space left, bin), sorted: best fit = first that fits
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        at = bisect.bisect_left(free, (lengths[i], -1))
        if at == len(free):
            space, b = row_len - lengths[i], len(bins)
            bins.append([i])
        else:
            space, b = free.pop(at)
            bins[b].append(i)
            space -= lengths[i]
        if len(bins[b]) < most:
            bisect.insort(free, (space, b))
    return bins


def build_rows(bins: list[list[Piece]], lengths: list[int], row_len: int, pad_id: int,
               order: np.ndarray | None = None) -> Rows:  # fmt: skip
    """Rows of the pieces of ``bins`` laid end to end, ``lengths[r]`` tokens in row ``r``, the
    rest padding; with ``order``, row ``i`` of the result is row ``order[i]``. Each piece is one
    slice of its chunk's tokens and of their places in their documents (``Docs.token_positions``),
    all joined in one copy, in the order the rows go out; positions restart where a piece
    continues a cut document (its first place there is not 0)."""
    n = len(bins)
    if not any(bins):
        return Rows.padding(0, row_len, pad_id)
    rows = range(n) if order is None else order.tolist()
    pieces = [p for r in rows for p in bins[r]]
    filled = [lengths[r] for r in rows]  # each row's tokens, in the order the rows go out
    if any(p.docs.patches is not None for p in pieces):
        return _build_image_rows(pieces, filled, row_len, pad_id)
    tokens, positions, sources, starts = laid_end_to_end(pieces, sum(filled))
    filled = np.array(filled, np.int64)
    if (filled == row_len).all():
        shape = (n, row_len)
        return Rows(tokens.reshape(shape), positions.reshape(shape), sources.reshape(shape),
                    starts.reshape(shape))  # fmt: skip
    out = Rows.padding(n, row_len, pad_id)  # rows that end in padding: each row's tokens first
    first = np.zeros(n, np.int64)
    np.cumsum(filled[:-1], out=first[1:])
    shift = np.arange(n, dtype=np.int64) * row_len - first  # from a row's place in the tokens to its own
    place = np.arange(len(tokens), dtype=np.int64) + np.repeat(shift, filled)
    for name, values in zip(Rows.FIELDS, (tokens, positions, sources, starts), strict=True):
        getattr(out, name).reshape(-1)[place] = values
    return out


def laid_end_to_end(pieces: list[Piece], total: int) -> tuple[np.ndarray, ...]:
    """The pieces' tokens end to end (``total`` of them), with their places in their documents
    (restarting at 0 where a piece continues a cut document), their datasets, and where
    documents start: compiled (``_rows.c``, the same values) where it was built."""
    if _gather is not None:
        out = (np.empty(total, np.int32), np.empty(total, np.int32), np.empty(total, np.int16),
               np.empty(total, bool))  # fmt: skip
        _gather(pieces, total, *out)
        return out
    count = len(pieces)
    tokens = np.concatenate([p.docs.tokens[p.start : p.stop] for p in pieces])
    positions = np.concatenate([p.docs.token_positions()[p.start : p.stop] for p in pieces])
    sizes = np.fromiter((p.stop - p.start for p in pieces), np.int64, count)
    sources = np.repeat(np.fromiter((p.dataset for p in pieces), np.int16, count), sizes)
    at = np.zeros(count, np.int64)  # where each piece begins, padding left out
    np.cumsum(sizes[:-1], out=at[1:])
    starts = positions == 0  # document starts (a cut piece does not start at 0, yet)
    for i in np.flatnonzero(positions[at]).tolist():  # pieces that continue a cut document
        p, a = pieces[i], int(at[i])
        shift = positions[a]
        positions[a : a + min(p.stop, int(p.docs.offsets[p.doc + 1])) - p.start] -= shift
    return tokens, positions, sources, starts


def _build_image_rows(pieces: list[Piece], lengths: list[int], row_len: int, pad_id: int) -> Rows:
    """As ``build_rows``, for pieces that may hold image tokens (their patches travel along)."""
    n = len(lengths)
    tokens = np.concatenate([p.docs.tokens[p.start : p.stop] for p in pieces])
    sizes = np.fromiter((len(p) for p in pieces), np.int64, len(pieces))
    at = np.zeros(len(pieces), np.int64)
    np.cumsum(sizes[:-1], out=at[1:])
    starts = np.zeros(len(tokens), bool)  # document starts
    cuts = []  # pieces that continue a document: positions restart there too
    for p, a in zip(pieces, at.tolist(), strict=True):
        offsets = p.docs.offsets
        if p.start > offsets[p.doc]:
            cuts.append(a)
        if p.stop > offsets[p.doc + 1]:  # a run of several documents
            inner = offsets[p.doc + 1 : int(offsets.searchsorted(p.stop))]
            starts[a + inner - p.start] = True
    starts[at] = True
    restart = starts.copy()
    starts[cuts] = False
    segments = np.flatnonzero(restart)  # every run of positions from 0 begins at one of these
    sizes_of = np.diff(segments, append=len(tokens))
    positions = np.arange(len(tokens), dtype=np.int32) - np.repeat(segments.astype(np.int32), sizes_of)
    sources = np.repeat(np.fromiter((p.dataset for p in pieces), np.int16, len(pieces)), sizes)
    vision = _image_tokens(pieces, len(tokens))
    flat = (tokens, positions, sources, starts, *(() if vision is None else vision[:1]))
    if all(k == row_len for k in lengths):
        shaped = [x.reshape(n, row_len) for x in flat]
        out = Rows(*shaped[:4])
    else:
        out = Rows.padding(n, row_len, pad_id)
        shaped = [getattr(out, f) for f in Rows.FIELDS]
        if vision is not None:
            shaped.append(np.zeros((n, row_len), bool))
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        for r in range(n):
            a, b = int(bounds[r]), int(bounds[r + 1])
            for array, values in zip(shaped, flat, strict=True):
                array[r, : b - a] = values[a:b]
    if vision is not None:  # padding sits at row ends, so the patches stay in token order
        out.vision = RowPatches.of(shaped[4], vision[1])
    return out


def _image_tokens(pieces: list[Piece], total: int) -> tuple[np.ndarray, Patches] | None:
    """Which of the pieces' tokens are image tokens, and their patches; None without images."""
    found = [p.docs.patches_of(p.start, p.stop) for p in pieces]
    found = [None if f is None or not len(f[1]) else f for f in found]
    dims = {f[1].pixels.shape[1] for f in found if f is not None}
    if not dims:
        return None
    if len(dims) > 1:
        raise ValueError(f"patches of different sizes {sorted(dims)} in one lane: use one images() step")
    dim = dims.pop()
    masks = [np.zeros(len(p), bool) if f is None else f[0] for p, f in zip(pieces, found, strict=True)]
    mask = np.concatenate(masks)
    assert len(mask) == total
    return mask, Patches.concat([f[1] for f in found if f is not None], dim)
