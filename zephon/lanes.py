"""Lanes: one lane's stream of batches, window after window.

The workers read and tokenize the lane's chunks of every dataset ahead of need (which chunk comes
next is a pure plan, so they never wait for the lane). The lane itself, in order and alone, mixes
documents (``zephon.work.mixture``), packs them into exactly the rows of one window, shuffles
those rows and cuts them into microbatches. A window ends on a whole number of microbatches (the
first is one microbatch, each next twice the last, up to ``window_rows``), and the next starts at
the exact token where packing stopped, so a lane's checkpoint is its mixer's position at a
window start plus the batches of that window already delivered.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import BrokenExecutor, Future
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from zephon.batch import Batch
from zephon.digests import ChunkDigests, changed
from zephon.errors import with_context
from zephon.io import Chunk
from zephon.io.formats import lines
from zephon.io.remote import Requests
from zephon.ops import BatchRows, Images, PackFlat, Shuffle, WorkOperator, pack, tokenize
from zephon.ops.containers import RowPatches
from zephon.runners import Executor
from zephon.state import LaneState
from zephon.work import LanePlan, Mixer, MixState, mixture

log = logging.getLogger(__name__)
_SAID_PYTHON: list[str] = []  # the compiled parts found missing, said once a process


def say_if_not_compiled() -> None:
    """Warns, once a process, where the compiled parts (``setup.py``) were not built: their
    Python runs instead, which gives the same batches for more CPU a token (the lane's own work
    about twice as much)."""
    parts = {"zephon.work._shares": mixture._compiled, "zephon.ops._rows": pack._gather,
             "zephon.ops._docs": tokenize._lay_out,
             "zephon.io.formats._lines": lines._objects_per_line}  # fmt: skip
    missing = [name for name, part in parts.items() if part is None]
    if missing and not _SAID_PYTHON:
        _SAID_PYTHON.extend(missing)
        log.warning(
            "zephon: %s not built (no C compiler at install?): their Python runs instead, the same "
            "batches for more CPU a token; reinstall zephon where a C compiler is present (pip install "
            "--no-cache-dir --force-reinstall --no-deps, so that pip does not reuse a wheel built without)",
            ", ".join(missing),
        )


class ChunkWork:
    """Consecutive stateless operators fused into one work function: one task per chunk. The
    first is the read (``Read``); an error says where: the file and line or row of the record
    it came from, where an operator said which record (``zephon_record``), else the chunk."""

    def __init__(self, ops: list[WorkOperator], dataset_names: list[str]):
        self.ops, self.names = ops, dataset_names
        self.skips = _SkipLog()

    def __call__(self, chunk: Chunk) -> Any:
        try:
            unit = self.ops[0].work(chunk)  # the read
            digest, requests = unit.digest, unit.requests
            for op in self.ops[1:]:
                unit = op.work(unit)
            unit.digest, unit.requests = digest, requests  # what the read found travels on
            if getattr(unit, "skipped", None):
                for record, why in unit.skipped:
                    self.skips.report(chunk, record, why, self.where)
                unit.skipped = []
            return unit
        except Exception as e:
            where = self.where(chunk, getattr(e, "zephon_record", None))
            if not isinstance(e, ValueError):
                e.add_note(where)
                raise
            error = with_context(e, where)
            if error is e:
                raise
            raise error from e

    @property
    def imports(self) -> tuple[str, ...]:
        """What the operators need imported in a worker process (``WorkOperator.imports``)."""
        return tuple(dict.fromkeys(m for op in self.ops for m in op.imports))

    @property
    def tokenizers(self) -> tuple[tuple[str, str], ...]:
        """The tokenizers the operators load (``WorkOperator.tokenizers``)."""
        return tuple(dict.fromkeys(t for op in self.ops for t in op.tokenizers))

    @property
    def holds_gil(self) -> str | None:
        """What of the work holds the GIL, and what to choose instead (``WorkOperator.holds_gil``)."""
        return next((op.holds_gil for op in self.ops if op.holds_gil), None)

    def prepare(self) -> None:
        """Load what the operators need (a tokenizer) before the first chunk."""
        for op in self.ops:
            op.prepare()

    def where(self, chunk: Chunk, record: int | None) -> str:
        read = self.ops[0]
        dataset = read.datasets[chunk.dataset]
        if record is not None:
            try:
                return f"dataset {dataset.name!r}, {dataset.locate(chunk, record, read.io)}"
            except Exception:  # the location is a courtesy: the chunk still says where
                pass
        return chunk_where(dataset, chunk, read.io)


def chunk_where(dataset, chunk: Chunk, io=None) -> str:
    """``dataset 'name', FILE, bytes [a, b)``: where ``chunk`` is (by shard number, should the
    file's name be unknown here)."""
    try:
        return f"dataset {dataset.name!r}, {dataset.span(chunk, io)}"
    except Exception:  # the location is a courtesy: the chunk still says where
        return f"dataset {dataset.name!r} (shard {chunk.shard}, [{chunk.start}, {chunk.stop}))"


class _SkipLog:
    """Warnings for skipped records (``on_error="skip"``): the first ``most`` of a run in each
    process, each naming its file and line or row; after that only ``stats()`` counts them."""

    def __init__(self, most: int = 20):
        self.most, self.count, self.lock = most, 0, threading.Lock()

    def __getstate__(self):
        return self.most

    def __setstate__(self, most):
        self.__init__(most)

    def report(self, chunk: Chunk, record: int, why: str, where) -> None:
        with self.lock:
            self.count += 1
            count = self.count
        if count <= self.most:
            log.warning("skipped a bad record: %s: %s", where(chunk, record), why)
        if count == self.most:
            log.warning(
                "further skipped records are not logged one by one: stats()['counters']"
                "['skipped_records'] counts them"
            )


class ReadAhead:
    """How many chunks of each dataset a lane asks the workers for ahead of the one it reads:
    one number for all the lanes of a run (only the lane being made reads ahead, so its
    read-ahead is what keeps the workers busy; the others hold theirs until their turn).

    Until every dataset has given a result, it keeps three units in all asked for ahead across a
    lane's datasets (the floor). From then on, as many as fit ``BUDGET`` bytes of results over
    the rank's lanes, at the largest result seen of each dataset, between that floor and
    ``per_worker`` units per worker (the runner's: what a worker holds at once and what follows):
    results of a few hundred kilobytes, as small datasets' chunks give, go deeper; a corpus's
    1 MiB chunks (2 MB of tokens and positions) keep one ahead each. The depth only decides when
    work is asked for, never what a batch holds.

    The floor at the start, not four units a worker: before any result, every lane's first
    window waits on the chunks asked for first, and the workers were busy with the first lane's
    chunks for later windows while the next lanes' first chunks queued (two thread workers,
    8 lanes, over a corpus: 0.8-1.0 s from the first batch to the 4 millionth token, against
    0.4-0.7 s inline). Side by side, 8M tokens end to end, medians of 5 and 8 interleaved: over
    the corpus two thread workers 0.91x the time, two process workers 0.92x; over the small
    datasets threads 0.91x, processes 1.00x.

    Measured (the throughput benchmark's three small datasets, chunks of about 70 KB, two
    process workers, steady): a lane fills a window from some thirty chunks in a few tens of
    milliseconds, faster than three chunks ahead come back, and waited for the workers 40% of
    its time while they idled half of theirs; six ahead (and four units at a worker): 1.10-1.12x
    the tokens/s, side by side. Thread workers measured slower deeper (0.97x at six): they keep
    four units a worker. Over a corpus (1 MiB chunks), one ahead instead of three: the same
    tokens/s with either runner, 50-100 MiB less peak RSS (two process workers: 1.0 GiB before).
    """

    BUDGET = 96 << 20  # bytes of results held by a rank's lanes

    def __init__(self, lanes: int, datasets: int, parallelism: int, per_worker: int):
        self.lanes = lanes
        self.floor = -(-3 // datasets)
        self.want = max(self.floor, -(-per_worker * parallelism // datasets))
        self.depth = self.floor
        self.largest = [0] * datasets  # bytes of the largest result seen, per dataset

    @staticmethod
    def none() -> ReadAhead:
        """No reading ahead (inline: it would only delay the batch at hand)."""
        ahead = ReadAhead(1, 1, 0, 0)
        ahead.floor = ahead.want = ahead.depth = 0
        return ahead

    def seen(self, dataset: int, nbytes: int) -> None:
        """A result of ``nbytes`` came back for ``dataset``: the depth follows the largest."""
        if not self.want or nbytes <= self.largest[dataset]:
            return
        self.largest[dataset] = nbytes
        if all(self.largest):  # every dataset's results: what one more chunk each holds
            fits = self.BUDGET // (self.lanes * sum(self.largest)) - 1
            self.depth = max(self.floor, min(self.want, fits))


def window_needed(window: int, to_go: float, rate: float | None, rows_in: Callable[[int], int]) -> int:
    """The window a lane likely first needs a chunk in: ``to_go`` chunks of its dataset past where
    the lane's current ``window`` starts, at ``rate`` chunks of that dataset per row
    (``rows_in(w)``: the rows of window ``w``); without a rate yet, the current window."""
    if to_go <= 0 or not rate:
        return window
    need, w = to_go / rate, window  # rows from this window's start
    while need >= rows_in(w) and w < window + 64:
        need, w = need - rows_in(w), w + 1
    return w


class Pace:
    """How fast the lanes of a run go through each dataset's chunks, in chunks per row, over the
    windows every lane has made so far (the lanes mix alike): it says which window a chunk read
    ahead is likely needed in. Where a rate moves by a quarter or more (the first window of the
    run gives the first), the queued chunks of every lane are ordered again."""

    def __init__(self, datasets: int):
        self.chunks, self.rows = [0.0] * datasets, 0
        self.used: list[float | None] = [None] * datasets  # the rates the queued chunks follow
        self.streams: list[ChunkStreams] = []

    def rate(self, dataset: int) -> float | None:
        return self.chunks[dataset] / self.rows if self.rows and self.chunks[dataset] else None

    def made(self, rows: int, chunks: list[float]) -> None:
        """A lane made ``rows`` rows from ``chunks`` of each dataset."""
        self.rows += rows
        self.chunks = [a + b for a, b in zip(self.chunks, chunks, strict=True)]
        rates = [self.rate(d) for d in range(len(self.chunks))]
        if any(_moved(old, new) for old, new in zip(self.used, rates, strict=True)):
            self.used = rates
            for streams in self.streams:
                streams.reorder()


def _moved(old: float | None, new: float | None) -> bool:
    return (old is None) != (new is None) or (old is not None and abs(new / old - 1) >= 0.25)


class ChunkStreams:
    """A lane's chunks of each dataset, tokenized by the workers up to ``ahead.depth`` chunks ahead.

    Each goes to the workers with the window it is likely needed in (``window_needed``, at the
    run's ``Pace``), then the lane, then how far ahead it is: the runners work on the most urgent
    first, and the consumer takes the lanes' windows round-robin. Measured (two process workers,
    HF tokenizers, the throughput benchmark's 70 KB chunks, a consumer at a quarter of the
    tokenizer's rate): with every chunk past the current one sent as needed in the next window,
    each lane's read-ahead came before the next lane's need, and the first 16 batches waited for
    the workers 1-2 s in all; by need, only the batches before the workers were up waited.
    """

    def __init__(
        self, plan: LanePlan, lane: int, executor: Executor, ahead: ReadAhead, timeout: float | None = None,
        digests: ChunkDigests | None = None, *, rows_in: Callable[[int], int], pace: Pace, io=None,
    ):  # fmt: skip
        self.plan, self.lane, self.executor, self.ahead = plan, lane, executor, ahead
        self.io = io  # the run's IOConfig: where expect reads a chunk itself
        self.timeout = timeout  # seconds a chunk may take on the workers before it is reported
        self.window = 0  # the window being filled: chunks needed for it go first
        self.rows_in = rows_in  # the rows of a window (LaneOps.rows_in)
        self.pace = pace  # the run's, shared by its lanes
        pace.streams.append(self)
        # per dataset: where the current window starts, in chunks (the part of one read, a fraction)
        self.at = [0.0] * len(plan.tables)
        self.queues: list[deque[tuple[int, Future]]] = [deque() for _ in plan.tables]
        self.ends: list[int | None] = [None] * len(plan.tables)  # first chunk number past the end
        self.digests = digests or ChunkDigests([len(t) for t in plan.tables])
        self.reads: dict[tuple[int, int], str] = {}  # (dataset, chunk number): digest, as read
        self.requests = [[0, 0] for _ in plan.tables]  # per dataset: requests and bytes its reads took

    def fetch(self, dataset: int, k: int, skip: int = 0) -> Any:
        """The lane's ``k``-th chunk of ``dataset``, tokenized from record ``skip`` on (waits for
        it), or None past the dataset's end."""
        queue = self._submit(dataset, k, skip)
        if not queue or k - queue[0][0] >= len(queue):
            return None
        future = queue[k - queue[0][0]][1]
        if not future.done():
            self.executor.hurry(future)  # read ahead for later, needed now
        try:
            docs = self._wait(future)
        except BrokenExecutor as e:
            raise RuntimeError(
                f"lane {self.lane}: a worker died while on {self._where(dataset, k)} ({e})"
            ) from e
        self._read(dataset, k, docs.digest)
        self.ahead.seen(dataset, docs.nbytes)
        self._count(dataset, docs.requests)
        return docs

    def _count(self, dataset: int, requests: tuple[int, int]) -> None:
        """A read of ``dataset`` took ``requests`` (requests, bytes): the run's count of them."""
        cost = self.requests[dataset]
        cost[0], cost[1] = cost[0] + requests[0], cost[1] + requests[1]

    def _read(self, dataset: int, k: int, digest: str) -> None:
        """Chunk ``k`` of ``dataset`` gave bytes of ``digest``: the same as ever, or an error."""
        index = self.plan.dealers[dataset].chunk_index(self.lane, k)
        self.digests.check(dataset, index, digest, lambda: self._where(dataset, k))
        self.reads[dataset, k] = digest

    def expect(self, digests) -> None:
        """The digests a lane's state holds: of chunks its replay reads again. Those of a state
        saved before chunk digests were XXH3 (16 hex digits of SHA-256) are checked here, each
        chunk read now and hashed by SHA-256 (a handful, once per restore from such a state);
        the replay then records their XXH3."""
        old = []
        for dataset, k, digest in digests:
            chunk = self.plan.chunk(dataset, self.lane, k)
            if chunk is None:
                raise ValueError(
                    f"lane {self.lane}: the state holds the digest of chunk {k} of dataset "
                    f"{self.plan.source.names[dataset]!r}, which the lane does not have"
                )
            if digest.startswith("xxh3:"):
                self._read(dataset, k, digest)
            else:
                old.append((dataset, k, chunk, digest))
        if old:
            log.info("zephon: lane %d: reading %d chunks to check the SHA-256 digests its state holds "
                     "(saved before chunk digests were XXH3)", self.lane, len(old))  # fmt: skip
        for dataset, k, chunk, digest in old:
            source, requests = self.plan.source.datasets[dataset], Requests()
            now = source.read_chunk(chunk, self.io, requests, digest="sha256").digest
            self._count(dataset, requests.as_tuple())
            if now != digest:
                raise changed(self._where(dataset, k), digest, now, "the checkpoint's state holds it")

    def reads_from(self, state: MixState) -> tuple[tuple[int, int, str], ...]:
        """The digests of the chunks read at or after ``state``'s positions (those a restore from
        there reads again); the earlier ones are forgotten."""
        keep = {key: digest for key, digest in self.reads.items() if key[1] >= state.positions[key[0]].chunk}
        self.reads = keep
        return tuple((d, k, digest) for (d, k), digest in sorted(keep.items()))

    def _wait(self, future: Future) -> Any:
        """``future``'s result; a TimeoutError once a unit has been with the workers for
        ``timeout`` seconds: timed from when the workers took it, not from when the lane began
        to wait (the lane may be busy while the workers are stuck, or wait for a unit still queued
        behind the stuck ones)."""
        if self.timeout is None:
            return future.result()
        poll = min(1.0, self.timeout / 20)
        while True:
            try:
                return future.result(timeout=poll)
            except TimeoutError:
                held = self.executor.stuck(self.timeout)
                if held is None:
                    continue
            if isinstance(held, Chunk):  # else the start of the workers
                where = chunk_where(self.plan.source.datasets[held.dataset], held)
                what = f"{where} has not come back from the workers"
            else:
                what = f"{held} has not ended"
            raise TimeoutError(
                f"lane {self.lane}: {what} in {self.timeout:g} s: a worker is stuck (stopped, or "
                "swapping?). If that can take so long, raise the option worker_timeout"
            )

    def _where(self, dataset: int, k: int) -> str:
        return chunk_where(self.plan.source.datasets[dataset], self.plan.chunk(dataset, self.lane, k))

    def begin(self, start: LaneState) -> None:
        """The lane starts at ``start``: its window, and the chunks its datasets stand in."""
        self.window = start.window
        self.at = [float(position.chunk) for position in start.mix.positions]

    def prime(self, start: LaneState) -> None:
        """Hand the workers the chunks a lane starting at ``start`` reads first, without waiting."""
        self.begin(start)
        for d, position in enumerate(start.mix.positions):
            self._submit(d, position.chunk, position.record)

    def _submit(self, dataset: int, k: int, skip: int) -> deque:
        """Chunks ``k`` to ``k + ahead.depth`` of ``dataset`` on the workers (those not there yet)."""
        queue, end, depth = self.queues[dataset], self.ends[dataset], self.ahead.depth
        if queue and queue[0][0] > k:
            queue.clear()  # not expected: an earlier chunk than any kept; read it again
        j = queue[-1][0] + 1 if queue else k
        while j <= k + depth and (end is None or j < end):
            chunk = self.plan.chunk(dataset, self.lane, j)
            if chunk is None:
                self.ends[dataset] = end = j
                break
            if j == k and skip:  # resuming inside the chunk: tokenize only what is left
                chunk = dataclasses.replace(chunk, skip=skip)
            queue.append((j, self.executor.submit(chunk, self._needed_in(dataset, j))))
            j += 1
        return queue

    def _needed_in(self, dataset: int, j: int) -> tuple[int, int, int]:
        """The priority of the lane's chunk ``j`` of ``dataset``: (window, lane, chunks ahead)."""
        at = self.at[dataset]
        window = window_needed(self.window, j - at, self.pace.rate(dataset), self.rows_in)
        return window, self.lane, j - int(at)

    def reorder(self) -> None:
        """The queued chunks, ordered again at the run's pace."""
        for dataset, queue in enumerate(self.queues):
            for j, future in queue:
                if not future.done():
                    self.executor.reorder(future, self._needed_in(dataset, j))

    def release(self, state: MixState) -> None:
        """The current window is made and the lane stands at ``state``, where the next starts:
        forget the chunks before its positions (the lane will not read them again)."""
        at = []
        for queue, position in zip(self.queues, state.positions, strict=True):
            while queue and queue[0][0] < position.chunk:
                queue.popleft()
            at.append(position.chunk + _part_read(queue, position))
        made, self.window = self.rows_in(self.window), self.window + 1
        passed = [max(0.0, b - a) for a, b in zip(self.at, at, strict=True)]
        self.at = at
        self.pace.made(made, passed)

    def cancel(self) -> None:
        for queue in self.queues:
            for _, future in queue:
                future.cancel()
            queue.clear()


def _part_read(queue: deque, position) -> float:
    """The share of the chunk at ``position`` read before its record: 0 where it is not back yet."""
    if not queue or queue[0][0] != position.chunk or not queue[0][1].done() or not position.record:
        return 0.0
    future = queue[0][1]
    if future.cancelled() or future.exception() is not None:
        return 0.0
    records = getattr(future.result(), "records", None)
    if records is None or not len(records):
        return 0.0
    return float(np.searchsorted(records, position.record)) / len(records)


@dataclass(frozen=True, slots=True)
class LaneOps:
    """What a lane does with its documents: pack a window, maybe shuffle it, batch it."""

    pack: PackFlat
    shuffle: Shuffle | None
    batch: BatchRows
    window_rows: int
    images: Images | None = None  # image-text data: every batch carries its image tokens' patches

    def rows_in(self, window: int) -> int:
        """Windows start at one microbatch and double up to ``window_rows``: every lane gives
        its first batch after one microbatch of rows, and has its next window made while the
        last one is consumed."""
        size = self.batch.microbatch_size
        return self.window_rows if window >= 32 else min(self.window_rows, size << window)

    def batches_before(self, window: int) -> int:
        """Batches of a lane's windows ``0 .. window - 1``, all of them whole (only a lane's last
        window, where a dataset that stops ends it, may hold fewer)."""
        ramp = sum(self.rows_in(w) for w in range(min(window, 32)))
        return (ramp + max(0, window - 32) * self.window_rows) // self.batch.microbatch_size

    def check_start(self, lane: int, state: LaneState) -> None:
        """A lane state's ``index`` follows from its window and the batches of it delivered:
        refuse one that cannot have been saved under this recipe."""
        before, delivered = self.batches_before(state.window), state.delivered
        whole = state.index == before + delivered
        # a lane that ended inside its last window stands at the next one with fewer batches
        ended = delivered == 0 and self.batches_before(state.window - 1) < state.index < before
        if not (whole or ended):
            raise ValueError(
                f"lane {lane}: the state's index {state.index} does not follow from its window "
                f"{state.window} and delivered {delivered}: this recipe's windows 0..{state.window - 1} "
                f"hold {before} batches, so index must be {before + delivered}. The state is damaged "
                "or was saved under another recipe"
            )


class Made(NamedTuple):
    """A batch, and where its lane stands once it is delivered: in ``window``, ``delivered``
    batches of it, ``mix`` the mixer at that window's start, and ``digests`` those of the chunks
    a restore from there reads again (``(dataset, chunk number, digest)``, see zephon.digests);
    ``tokens`` and ``documents``: the batch's per dataset, counted where it was made (with a
    background runner, the lanes' thread, where its arrays are still in the cache, not the
    consumer's, which the training loop waits on)."""

    batch: Batch
    window: int
    delivered: int
    mix: MixState
    digests: tuple[tuple[int, int, str], ...]
    tokens: list[int]
    documents: list[int]


def lane_batches(
    plan: LanePlan, ops: LaneOps, lane: int, start: LaneState, streams: ChunkStreams
) -> Iterator[Made]:
    """The lane's batches from ``start`` on, each with where the lane stands once it is delivered.

    The first ``start.delivered`` batches of ``start.window`` are made again and dropped.
    """
    source = plan.source
    streams.begin(start)
    max_empty = [2 * plan.chunks_per_lane_epoch(d) + 2 for d in range(len(source.datasets))]
    try:
        fresh = start.window == 0
        _check_positions(plan, lane, start, max_empty)
        streams.expect(start.digests)
        try:
            mixer = Mixer(source.rule(plan.num_lanes), streams.fetch, start.mix, max_empty, fresh)
        except ValueError as e:
            raise with_context(e, f"lane {lane}") from None
        window, index, at_start = start.window, start.index - start.delivered, start.mix
        while True:
            streams.window = window
            shuffle = ops.shuffle
            order = None if shuffle is None else functools.partial(shuffle.order, lane=lane, window=window)
            rows = ops.pack.fill(mixer, ops.rows_in(window), order)  # shuffled as they are laid out
            if len(rows) == 0:
                return
            parts = ops.batch.split(rows)
            counters, end = mixer.take_counters(), mixer.state
            streams.release(end)
            replay = streams.reads_from(at_start), streams.reads_from(end)
            skip = start.delivered if window == start.window else 0
            if skip >= len(parts):
                raise ValueError(
                    f"lane {lane}: the state says {skip} batches of window {window} were delivered, "
                    f"but that window holds {len(parts)}: the state does not belong to this recipe"
                )
            for j in range(skip, len(parts)):
                part = parts[j]
                batch = Batch(lane, index + j, part.tokens, part.positions, part.sources, part.starts)
                if ops.images is not None:  # every batch, even one of text rows only
                    batch.vision = part.vision or RowPatches.none(*part.tokens.shape, ops.images.patch_dim)
                    batch.normalize = ops.images.mean, ops.images.std
                batch.counters = counters if j == 0 else {}
                tokens, documents = (c.tolist() for c in batch.counts_per_dataset(len(source.datasets)))
                last = j == len(parts) - 1
                if last:
                    yield Made(batch, window + 1, 0, end, replay[1], tokens, documents)
                else:
                    yield Made(batch, window, j + 1, at_start, replay[0], tokens, documents)
            index, window, at_start = index + len(parts), window + 1, end
            if mixer.ended:
                return
    finally:
        streams.cancel()


def _check_positions(plan: LanePlan, lane: int, start: LaneState, max_empty: list[int]) -> None:
    """Refuse read positions no run of this recipe can reach: past the end of a dataset that
    stops, or further than the documents the lane delivered allow (between two documents a lane
    passes at most ``max_empty`` empty chunks), so that a damaged state fails by name instead of
    silently reading elsewhere."""
    delivered = start.tokens if plan.source.unit == "tokens" else start.documents
    for d, (position, documents) in enumerate(zip(start.mix.positions, start.documents, strict=True)):
        name = plan.source.names[d]
        if start.mix.used[d] > delivered[d]:
            raise ValueError(
                f"lane {lane}: dataset {name!r}: the state's mixer has used {start.mix.used[d]} "
                f"{plan.source.unit} of it, more than the {delivered[d]} its batches delivered: the "
                "state is damaged or was saved under another recipe"
            )
        if start.window == 0 and (position.chunk or position.record or position.offset):
            raise ValueError(
                f"lane {lane}: dataset {name!r}: the state stands in window 0, which starts every "
                f"dataset at [0, 0, 0], but its position is {position.to_json()}"
            )
        past = position.chunk > 0 and plan.chunk(d, lane, position.chunk - 1) is None
        most = (documents + 1) * (max_empty[d] + 1)
        if past or position.chunk > most:
            why = (
                "past the end of the dataset" if past else
                f"further than the {documents} documents the lane delivered from it can have taken it "
                f"(at most chunk {most})"
            )  # fmt: skip
            raise ValueError(
                f"lane {lane}: dataset {name!r}: the state's position {position.to_json()} is {why}: the "
                "state is damaged or was saved under another recipe"
            )
