"""Mixing: which dataset a lane takes its next document from. Read this file top to bottom.

**Streams.** A lane reads each dataset as a stream of documents: the lane's chunks of that dataset
in the order the chunk dealer gives them (a pure plan, see ``plan.py``), and inside each chunk its
documents in file order, as the workers tokenized them. The workers read and tokenize ahead; the
mixer only waits when it needs a chunk that is not done yet.

**Position.** Per dataset the lane keeps one read position ``(chunk, record, offset)``: its
``chunk``-th chunk of the dataset, the document made of record ``record`` of that chunk, ``offset``
tokens into it. A position always points at a document that exists (empty chunks are stepped
over at once), or at the end of a dataset that stops. A lane resuming inside a chunk has the
workers tokenize the chunk from that record on only.

**Counters.** ``used[d]``: the units taken from dataset ``d`` so far: tokens for a token mixture,
documents for a record mixture (a document counts when its first token is taken).

**Rule.** Each take goes to the dataset whose next piece would be most overdue: the ``d`` that
minimizes ``(used[d] + next[d] / 2) / share[d]``, ties to the lower index, where ``next[d]`` is
the units of the piece ``d`` would give now. A piece is a whole document if it fits in the
``limit`` the packer asks for, else the first ``limit`` tokens of it (its rest stays at the head of
its dataset and competes again). Every dataset's realized share therefore stays within about one
piece, at most one packed row, of its target at every point of every lane, whatever the length of
the documents or chunks.

**Schedules.** With weights that change over the run (``zephon.work.schedule``) the key of ``d``
is the lane count at which the schedule owes ``d`` ``used[d] + next[d] / 2`` units, the inverse
of the integral of its weight; for fixed shares that is the key above.

**State.** ``positions`` and ``used``: a few integers per dataset, whatever the step.
"""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

try:  # the take by fixed shares, compiled (setup.py): the same pieces as _take_by_shares
    import zephon.work._shares as _compiled
except ImportError:  # not built (no C compiler at install): the Python below
    _compiled = None

UNITS = ("documents", "tokens")


def normalize(weights: dict[str, float], names: list[str], zero: bool = False) -> list[float]:
    """Weights for ``names`` (in order), checked and scaled to sum to 1; ``zero``: a weight may
    be 0 (a point of a schedule), as long as one is not. Only their ratios count, so weights
    whose sum overflows, or whose shares are too small for a float, are refused: scale them."""
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ValueError(f"mixture names unknown dataset(s) {unknown}; datasets are {names}")
    missing = [n for n in names if n not in weights]
    if missing:
        raise ValueError(f"mixture gives no weight for dataset(s) {missing}")
    values = [_weight(n, weights[n], zero) for n in names]
    total = sum(values)
    if total <= 0:
        raise ValueError(f"mixture weights {weights} are all 0: give at least one dataset a weight")
    if total == math.inf:
        raise ValueError(
            f"mixture weights {weights} sum to more than the largest float ({sys.float_info.max:.3g}): "
            f"scale them all down (only their ratios count), e.g. divide each by {max(values):.3g}"
        )
    shares = [v / total for v in values]
    for n, v, share in zip(names, values, shares, strict=True):
        if v > 0 and share < sys.float_info.min:
            instead = "give it 0" if zero else "leave the dataset out"
            raise ValueError(
                f"mixture weight for {n!r} ({weights[n]!r}) is too small next to the sum of the weights "
                f"({total:.3g}): its share {share!r} is under the smallest normal float "
                f"({sys.float_info.min:.3g}); raise it, or {instead}"
            )
    return shares


def _weight(name: str, w, zero: bool) -> float:
    kind = "a number >= 0" if zero else "a positive number"
    if isinstance(w, bool) or not isinstance(w, int | float):
        raise ValueError(f"mixture weight for {name!r} must be {kind}, got {w!r}")
    try:
        value = float(w)
    except OverflowError:  # an int over the largest float
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(
            f"mixture weight for {name!r} must be {kind}, got {w!r}: give finite weights (only their "
            "ratios count)"
        )
    if value < 0 or (value == 0 and not zero):
        raise ValueError(f"mixture weight for {name!r} must be {kind}, got {w!r}")
    if 0 < value < sys.float_info.min:
        raise ValueError(
            f"mixture weight for {name!r} is {w!r}, under the smallest normal float "
            f"({sys.float_info.min:.3g}), where ratios lose precision: scale all the weights up (only "
            "their ratios count)"
        )
    return value


def pick(shares: list[float], used: list[int], upcoming: list[float]) -> int:
    """The dataset whose next piece is most overdue: ``argmin (used + upcoming / 2) / share``."""
    best, best_key = 0, None
    for d, (share, u, n) in enumerate(zip(shares, used, upcoming, strict=True)):
        key = (u + n / 2) / share
        if best_key is None or key < best_key:
            best, best_key = d, key
    return best


def pick_scheduled(schedule, used: list[int], upcoming: list[float]) -> int:
    """:func:`pick` under a schedule: the dataset that comes due first, at the lane's unit count
    ``schedule.due(d, used + upcoming / 2)`` (for fixed shares that is ``(used + upcoming / 2) /
    share``), ties to the lower index."""
    best, best_key = 0, None
    for d, (u, n) in enumerate(zip(used, upcoming, strict=True)):
        key = schedule.due(d, u + n / 2)
        if best_key is None or key < best_key:
            best, best_key = d, key
    return best


@dataclass(slots=True)
class Position:
    """Where a lane stands in one dataset: its ``chunk``-th chunk, record ``record``, ``offset``."""

    chunk: int = 0
    record: int = 0
    offset: int = 0

    def to_json(self) -> list[int]:
        return [self.chunk, self.record, self.offset]


@dataclass(slots=True)
class MixState:
    """A lane's mixer at a window start. JSON: ``{"positions": [[chunk, record, offset], ...],
    "used": [units, ...]}``, one entry per dataset."""

    positions: list[Position]
    used: list[int]

    @staticmethod
    def start(num_datasets: int) -> MixState:
        return MixState([Position() for _ in range(num_datasets)], [0] * num_datasets)

    def copy(self) -> MixState:
        return MixState([Position(p.chunk, p.record, p.offset) for p in self.positions], list(self.used))

    def to_json(self) -> dict:
        return {"positions": [p.to_json() for p in self.positions], "used": list(self.used)}

    @staticmethod
    def from_json(data: Any, num_datasets: int) -> MixState:
        try:
            positions = [Position(*(int(x) for x in p)) for p in data["positions"] if len(p) == 3]
            used = [int(u) for u in data["used"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed mixer state {data!r}: {e}") from None
        if len(positions) != len(data["positions"]):
            raise ValueError(f"malformed mixer state {data!r}: positions are [chunk, record, offset]")
        if len(positions) != num_datasets or len(used) != num_datasets:
            raise ValueError(f"mixer state {data!r} does not match {num_datasets} datasets")
        if any(min(p.chunk, p.record, p.offset) < 0 for p in positions) or min(used) < 0:
            raise ValueError(f"mixer state {data!r} holds a negative number")
        return MixState(positions, used)


@dataclass(slots=True)
class Piece:
    """Tokens ``[start, stop)`` of one tokenized chunk (``docs``: a ``Docs`` container) of
    dataset ``dataset``; ``doc`` is the document that holds ``start``."""

    dataset: int
    docs: Any
    doc: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


# fetch(dataset, chunk number, first record) -> that chunk of the lane, tokenized from that record
# on (waits for the workers), or None past the end of a dataset that stops
Fetch = Callable[[int, int, int], Any]


@dataclass(frozen=True, slots=True)
class MixRule:
    """What a lane mixes by: the datasets' ``names``, their ``shares`` (summing to 1) of the
    ``unit`` they count (documents or tokens), and, where the shares change over the run, the
    lane's view of the schedule (a ``zephon.work.schedule.LaneSchedule``)."""

    names: list[str]
    shares: list[float]
    unit: str = "documents"
    schedule: Any = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A mixer's working state, for ``Mixer.restore`` (best-fit packing tries a prefix, then
    goes back): its chunk, document and offset per dataset, the units used, the tokenized chunks
    at hand and their document bounds, the counters of chunks entered, and whether it ended."""

    chunks: list[int]
    docs: list[int]
    offsets: list[int]
    used: list[int]
    heads: list[Any]
    bounds: list[Any]
    counters: dict[str, int]
    ended: bool


class Mixer:
    """One lane's mixer: takes pieces by the rule, from a state, and reports its state.

    Inside, a position is a document index into the chunk at hand (``heads[d]``); ``state``
    gives it as the record number, which does not depend on where the chunk was read from.
    ``bounds[d]`` holds that chunk's document offsets as a list: the rule looks at a few of them
    per piece, and a list answers in a tenth of the time of an array.
    """

    def __init__(
        self, rule: MixRule, fetch: Fetch, state: MixState, max_empty: list[int], fresh: bool = False
    ):
        if rule.unit not in UNITS:
            raise ValueError(f"mixture unit {rule.unit!r}: expected one of {UNITS}")
        self.names, self.shares, self.unit, self.fetch = rule.names, list(rule.shares), rule.unit, fetch
        self.compiled = _compiled  # zephon.work._shares, or None: every take in Python (tests compare)
        self.schedule = rule.schedule  # a LaneSchedule (zephon.work.schedule), or None for fixed shares
        self.chunks = [p.chunk for p in state.positions]
        self.offsets = [p.offset for p in state.positions]
        self.used = list(state.used)
        self.max_empty = max_empty  # consecutive empty chunks after which a dataset is unusable
        n = len(self.shares)
        self.heads: list[Any] = [None] * n  # the tokenized chunk at each position
        self.bounds: list[list[int] | None] = [None] * n  # heads[d].offsets, as a list
        self.docs = [0] * n  # document index into heads[d]
        self.hints = [0] * n  # by documents: each dataset's last run's length, where the next is sought
        self.counters: dict[str, int] = {}  # of the chunks entered since the last take_counters
        self.ended = False
        for d, position in enumerate(state.positions):
            head = self._enter(d, position.chunk, position.record)
            if head is not None:
                self.docs[d] = int(np.searchsorted(head.records, position.record))
                if fresh:  # a chunk's counters count when the lane enters it
                    self.counters = sum_counters([self.counters, head.counters])
                elif position != Position():  # a dataset the lane has not read yet starts there
                    self._check_position(d, position)
            elif position.record or position.offset:
                raise ValueError(
                    f"dataset {self.names[d]!r}: the state's position {position.to_json()} lies past the end "
                    f"of the dataset (the lane has no chunk {position.chunk} of it)"
                )
            self._settle(d)

    def _check_position(self, d: int, position: Position) -> None:
        """A saved position points at a document of its chunk, inside it (see Position)."""
        head, doc = self.heads[d], self.docs[d]
        if doc >= len(head) or int(head.records[doc]) != position.record:
            raise ValueError(
                f"dataset {self.names[d]!r}: the state's position {position.to_json()} names record "
                f"{position.record}, which is not a document of chunk {position.chunk} (its documents "
                f"from there on: {len(head) - doc})"
            )
        length = self.bounds[d][doc + 1] - self.bounds[d][doc]
        if position.offset >= length:
            raise ValueError(
                f"dataset {self.names[d]!r}: the state's position {position.to_json()} is {position.offset} "
                f"tokens into a document of {length} tokens"
            )

    @property
    def state(self) -> MixState:
        positions = []
        for d, head in enumerate(self.heads):
            record = int(head.records[self.docs[d]]) if head is not None else 0
            positions.append(Position(self.chunks[d], record, self.offsets[d]))
        return MixState(positions, list(self.used))

    # -- taking -----------------------------------------------------------------------------

    def take(self, limit: int, runs: bool = False) -> Piece | None:
        """The next piece, at most ``limit`` tokens; None once a dataset that stops ran out.

        With ``runs``, a piece may hold several whole documents of one chunk (and a cut of the
        next one, where ``limit`` ends): exactly the pieces that taking them one by one with
        ``limit`` shrinking by each piece would give, in one step. (The wrap packer asks for the
        room left in its row, so for it the two are the same.)
        """
        if self.ended:
            return None
        if len(self.shares) == 1:
            piece = self._cut(0, limit, runs)
        elif self.schedule is not None:  # one piece at a time: runs are worked out for fixed shares
            upcoming = [self._next_units(e, limit) for e in range(len(self.shares))]
            piece = self._cut(pick_scheduled(self.schedule, self.used, upcoming), limit, False)
        elif self.compiled is None:
            return self._take_by_shares(limit, runs)
        else:
            try:
                d, doc, start, stop, past_end = self.compiled.take_by_shares(
                    self.bounds, self.docs, self.offsets, self.used, self.shares, self.hints, limit, runs,
                    self.unit == "tokens",
                )  # fmt: skip
            except OverflowError:  # a count past 2**62 (before it changed anything): Python's ints
                return self._take_by_shares(limit, runs)
            piece = Piece(d, self.heads[d], doc, start, stop)
            if past_end:
                self._settle(d)
            return piece
        self._advance(piece.dataset, piece)
        return piece

    def fill(self, pieces: list[Piece], filled: int, want: int, row_len: int) -> int:
        """The wrap packer's takes: while ``filled < want`` tokens and the mixer has not ended,
        ``take(row_len - filled % row_len, runs=True)``, each piece appended to ``pieces``; the
        tokens filled after. By fixed shares the loop is compiled (``wrap_by_shares``), with the
        same pieces: it hands back to settle a dataset whose chunk it used up."""
        compiled = self.compiled is not None and self.schedule is None and len(self.shares) > 1
        while filled < want and not self.ended:
            if compiled:
                at = len(pieces)
                try:
                    filled, settle = self.compiled.wrap_by_shares(
                        self.bounds, self.docs, self.offsets, self.used, self.shares, self.hints,
                        self.unit == "tokens", self.heads, Piece, pieces, filled, want, row_len,
                    )  # fmt: skip
                except OverflowError:  # a count past 2**62, before that take changed anything
                    filled += sum(p.stop - p.start for p in pieces[at:])
                    compiled = False
                    continue
                if settle >= 0:
                    self._settle(settle)
                continue
            piece = self.take(row_len - filled % row_len, runs=True)
            if piece is None:
                break
            pieces.append(piece)
            filled += piece.stop - piece.start
        return filled

    def _take_by_shares(self, limit: int, runs: bool) -> Piece:
        """``take`` for fixed shares and several datasets: :func:`pick`'s keys (the same
        arithmetic, without its lists), the cut, the run (``_run_end``) and the advance, in one
        pass over the datasets: it runs for every piece of a lane, where each step on its own
        went over them again."""
        all_bounds, docs, offsets, used = self.bounds, self.docs, self.offsets, self.used
        tokens = self.unit == "tokens"
        best, best_key, left = 0, None, []
        for e, share in enumerate(self.shares):
            b, doc = all_bounds[e], docs[e]
            rem = b[doc + 1] - b[doc] - offsets[e]  # the tokens left in its document
            left.append(rem)
            n = (rem if rem < limit else limit) if tokens else (offsets[e] == 0)  # units of its next piece
            key = (used[e] + n / 2) / share
            if best_key is None or key < best_key:
                best, best_key = e, key
        d = best
        b, doc = all_bounds[d], docs[d]
        start, stop = b[doc] + offsets[d], b[doc + 1]
        if stop - start >= limit:
            stop = start + limit
        elif runs and doc + 2 < len(b):  # a whole document, and more after it in its chunk
            stop = self._run_end(d, doc + 1, start, limit, left, tokens)
        piece = Piece(d, self.heads[d], doc, start, stop)
        last = bisect.bisect_right(b, stop) - 1  # the doc holding stop
        if tokens:
            used[d] += stop - start
        else:  # documents begun: document starts inside [start, stop)
            used[d] += bisect.bisect_left(b, stop, 0, len(b) - 1) - doc - (offsets[d] > 0)
        docs[d], offsets[d] = last, stop - b[last]
        if last >= len(b) - 1:  # past its chunk's last document
            self._settle(d)
        return piece

    def _run_end(self, d: int, first: int, start: int, limit: int, left: list[int], tokens: bool) -> int:
        """Where the rule, piece by piece, would stop taking the documents of ``d`` after a piece
        from ``start`` to the end of document ``first - 1`` (``left``: every dataset's tokens left
        in its document). ``takes(j)``: whether the rule would take document ``first + j`` (as a
        piece of at most the room left) right after the ``j`` before it, by the comparisons of
        :func:`pick`. That is a prefix property: the key of ``d`` only grows with ``j`` (each
        document adds its tokens before the next one's half), the others' keys only shrink (the
        room left for their next piece shrinks), so the documents it takes are the first ``k``,
        and ``k`` is found by galloping from a guess, then bisecting: a few comparisons, where one
        by one took ``k``. The guess: by tokens, where the key of ``d`` passes the lowest of the
        others' keys as they stand now, found by bisecting the chunk's document offsets (the key
        of document ``i`` grows with ``offsets[i] + offsets[i + 1]``): at most one document off
        while the room left does not bind, and so two comparisons; by documents, the length of
        this dataset's last run. The guess only sets where the search starts, never its answer."""
        bounds, shares, all_used, offsets = self.bounds[d], self.shares, self.used, self.offsets
        used, share, begun = all_used[d], shares[d], offsets[d] == 0
        space, lowest, others = limit - bounds[first] + start, math.inf, []
        for e, s in enumerate(shares):
            if e == d:
                continue
            if tokens:
                rem = left[e]
                key = (all_used[e] + (rem if rem < space else space) / 2) / s
                lowest = key if key < lowest else lowest
            else:
                rem = (offsets[e] == 0) / 2
            others.append((e < d, all_used[e], rem, s))

        def takes(j: int) -> bool:
            here = bounds[first + j]
            space = limit - here + start
            if space <= 0:
                return False
            if tokens:
                length = bounds[first + j + 1] - here
                mine = (used + here - start + (length if length < space else space) / 2) / share
            else:
                mine = (used + begun + j + 0.5) / share
            for lower, u, rem, s in others:
                theirs = (u + (rem if rem < space else space) / 2) / s if tokens else (u + rem) / s
                if mine > theirs or (mine == theirs and lower):
                    return False
            return True

        if tokens:  # the first document whose midpoint lies past where d comes due, less one
            guess = bisect.bisect_left(bounds, lowest * share - used + start, first) - first - 1
        else:
            guess = self.hints[d]
        k = first_false(takes, len(bounds) - 1 - first, guess)
        self.hints[d] = k
        end = bounds[first + k]
        return end if end < start + limit else start + limit  # the last one cut where the room ends

    def _remaining(self, d: int) -> int:
        bounds, doc = self.bounds[d], self.docs[d]
        return bounds[doc + 1] - bounds[doc] - self.offsets[d]

    def _next_units(self, d: int, limit: int) -> int:
        if self.unit == "documents":
            return 1 if self.offsets[d] == 0 else 0
        return min(self._remaining(d), limit)

    def _cut(self, d: int, limit: int, runs: bool) -> Piece:
        docs, bounds, doc = self.heads[d], self.bounds[d], self.docs[d]
        start = bounds[doc] + self.offsets[d]
        doc_end = bounds[doc + 1]
        if not runs or doc_end - start >= limit:
            return Piece(d, docs, doc, start, min(doc_end, start + limit))
        return Piece(d, docs, doc, start, min(bounds[-1], start + limit))

    def _advance(self, d: int, piece: Piece) -> None:
        bounds = self.bounds[d]
        last = bisect.bisect_right(bounds, piece.stop) - 1  # the doc holding stop
        if self.unit == "tokens":
            self.used[d] += piece.stop - piece.start
        else:  # documents begun: document starts inside [start, stop)
            begun = bisect.bisect_left(bounds, piece.stop, 0, len(bounds) - 1)  # starts before stop
            self.used[d] += begun - self.docs[d] - (self.offsets[d] > 0)
        self.docs[d], self.offsets[d] = last, piece.stop - bounds[last]
        if last >= len(bounds) - 1:  # past its chunk's last document (else _settle has nothing to do)
            self._settle(d)

    # -- positions --------------------------------------------------------------------------

    def _enter(self, d: int, chunk: int, record: int) -> Any:
        """Chunk ``chunk`` of ``d``, from ``record`` on, as the head of ``d`` (None past its end)."""
        head = self.heads[d] = self.fetch(d, chunk, record)
        self.bounds[d] = None if head is None else head.offsets.tolist()
        return head

    def _settle(self, d: int) -> None:
        """Step over used-up and empty chunks to the next document of ``d``, or its end."""
        bounds = self.bounds[d]
        if bounds is not None and self.docs[d] < len(bounds) - 1:
            return  # inside its chunk: the common case
        docs, empty = self.heads[d], 0
        while docs is not None and self.docs[d] >= len(docs):
            empty = empty + 1 if len(docs) == 0 else 0
            if empty > self.max_empty[d]:
                raise ValueError(
                    f"dataset {self.names[d]!r} gave {empty} chunks in a row without a document: it "
                    "holds no usable records (blank lines? a filter that drops everything?)"
                )
            self.chunks[d], self.docs[d], self.offsets[d] = self.chunks[d] + 1, 0, 0
            docs = self._enter(d, self.chunks[d], 0)
            if docs is not None:
                self.counters = sum_counters([self.counters, docs.counters])
        if docs is None:
            self.ended = True

    def snapshot(self) -> Snapshot:
        """Everything ``restore`` needs to undo later takes (best-fit packing tries a prefix)."""
        return Snapshot(
            list(self.chunks), list(self.docs), list(self.offsets), list(self.used), list(self.heads),
            list(self.bounds), dict(self.counters), self.ended,
        )  # fmt: skip

    def restore(self, snapshot: Snapshot) -> None:
        s = snapshot
        self.chunks, self.docs, self.offsets, self.used = (
            list(s.chunks),
            list(s.docs),
            list(s.offsets),
            list(s.used),
        )
        self.heads, self.bounds, self.counters, self.ended = (
            list(s.heads),
            list(s.bounds),
            dict(s.counters),
            s.ended,
        )

    def take_counters(self) -> dict[str, int]:
        """Counters (empty documents, filtered records) of the chunks entered since the last call."""
        counters, self.counters = self.counters, {}
        return counters


def first_false(holds: Callable[[int], bool], n: int, guess: int) -> int:
    """The first ``j`` in ``[0, n)`` where ``holds(j)`` is false (``n`` if none), for a ``holds``
    true up to some point and false from there on: galloping up or down from ``guess``, then
    bisecting, so that a good guess costs two calls."""
    guess = max(0, min(guess, n))
    if guess < n and holds(guess):  # the answer is past guess
        lo, step = guess, 1  # holds(lo)
        hi = lo + step
        while hi < n and holds(hi):
            lo, step = hi, step * 2
            hi = lo + step
        hi = min(hi, n)
    else:  # the answer is at or before guess
        hi, step = guess, 1  # not holds(hi), or hi == n
        lo = hi - step
        while lo >= 0 and not holds(lo):
            hi, step = lo, step * 2
            lo = hi - step
        lo = max(lo, -1)  # holds(lo), or lo == -1
    while hi - lo > 1:  # the answer is in (lo, hi]
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return hi


def sum_counters(items: Iterable[dict[str, int]]) -> dict[str, int]:
    """Counters (empty documents, filtered and skipped records) added up, key by key."""
    total: dict[str, int] = {}
    for counters in items:
        for k, v in counters.items():
            total[k] = total.get(k, 0) + v
    return total
