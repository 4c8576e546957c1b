"""WebDataset tar shards: the files of one sample share a key (``dir/0001.jpg``, ``dir/0001.txt``).

A sample is a record ``{"__key__": key, ext: value, ...}``: ``txt``-like members become strings,
``json`` members parsed JSON, ``cls`` members ints, the rest (images) bytes. Chunks are ranges of
samples, planned from the tar headers (an index of each sample's byte span, read once per file and
process: one pass over the headers, skipping the member data); reading a chunk is one range read.

A tar cut off (inside a member, its padding or a header, or without its end-of-archive marker) or
with bytes that are not members (a damaged header, trailing garbage) has one bad record in place of
the sample where the damage starts: a ``DataError`` naming the shard and the byte, or with
``on_error="skip"`` a skipped record; the whole samples before it are read.
"""

from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass

from zephon.io.chunks import Group, Shard
from zephon.io.formats.base import LRU, BadRecord, ChunkRead, DataError, Format, Records, content_digest

_INDEXES = LRU(64)
TEXT = ("txt", "text", "caption", "cap")
INTS = ("cls", "cls2", "index")


@dataclass(frozen=True, slots=True)
class TarIndex:
    """Each sample's key, its members ``(ext, offset, size)`` and its byte span in the file.

    ``damage``: where the tar is damaged (cut off, or bytes that are not tar members), why; its
    last sample then stands for the damage: a bad record, with no members."""

    keys: list[str]
    members: list[list[tuple[str, int, int]]]
    spans: list[tuple[int, int]]
    damage: str | None = None

    def damaged(self, shard: Shard, key: str | None, why: str) -> TarIndex:
        """This index with its damage as its last sample: the sample ``key`` (whose files may be
        incomplete: it replaces the last one if that is it), or a sample of its own (None)."""
        keys, members, spans = list(self.keys), list(self.members), list(self.spans)
        at = spans[-1][0] if keys and key is not None and keys[-1] == key else None
        if at is not None:
            del keys[-1], members[-1], spans[-1]
        else:
            at = spans[-1][1] if spans else 0
        at = min(at, shard.size)
        key = key if key is not None else f"<damaged at byte {at}>"
        message = f"{shard.url}: {why}; re-create the shard, or pass on_error='skip' to skip it"
        return TarIndex([*keys, key], [*members, []], [*spans, (at, at)], message)


def split_key(name: str) -> tuple[str, str]:
    """``dir/0001.seg.png`` -> (``dir/0001``, ``seg.png``): the extension starts at the first dot of
    the file name, as WebDataset has it."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext if dot else ""


class WebDatasetFormat(Format):
    name = "webdataset"
    unit = "rows"

    def index(self, shard: Shard, opener) -> TarIndex:
        key = (shard.url, shard.size, shard.version)
        index = _INDEXES.get(key)
        if index is None:
            index = self._scan(shard, opener)
            _INDEXES.put(key, index)
        return index

    def _scan(self, shard: Shard, opener) -> TarIndex:
        keys, members, spans = [], [], []
        with opener.open(shard) as raw:
            f = _Blocks(raw, shard.size)
            try:
                tar = tarfile.open(fileobj=f, mode="r:")  # noqa: SIM115 - it reads from f, closed below
            except tarfile.TarError as e:
                raise DataError(f"{shard.url}: not a readable tar file ({e})") from None
            damage, last = None, None
            try:
                for info in tar:
                    damage = _cut_member(shard, info)
                    if damage is not None:
                        break
                    last = info
                    if not info.isfile():
                        continue
                    key, ext = split_key(info.name)
                    if not keys or keys[-1] != key:
                        keys.append(key)
                        members.append([])
                        spans.append((info.offset, info.offset_data + info.size))
                    members[-1].append((ext, info.offset_data, info.size))
                    spans[-1] = (spans[-1][0], info.offset_data + info.size)
                else:
                    damage = _tail(shard, f, tar.offset, last)
            except tarfile.TarError as e:
                key = split_key(last.name)[0] if last is not None else None
                damage = (key, f"the header at byte {tar.offset:,} cannot be read ({e})")
        if len(set(keys)) != len(keys):
            dup = next(k for i, k in enumerate(keys) if k in keys[:i])
            raise DataError(
                f"{shard.url}: the files of sample {dup!r} are not next to each other in the tar; "
                "write each sample's files together (as WebDataset's writers do)"
            )
        index = TarIndex(keys, members, spans)
        return index if damage is None else index.damaged(shard, *damage)

    def schema_names(self, shard: Shard, opener) -> list[str] | None:
        """``__key__`` and the first sample's extensions."""
        index = self.index(shard, opener)
        return ["__key__", *(ext for ext, _, _ in index.members[0])] if index.keys else None

    def groups(self, shard: Shard, opener) -> list[Group]:
        return [(0, len(self.index(shard, opener).keys), shard.size)]

    def read(
        self, shard, start, stop, columns, opener, skip_bad: bool = False, digest: str = "xxh3"
    ) -> ChunkRead:
        index = self.index(shard, opener)
        if start >= stop:
            return ChunkRead([], content_digest(algorithm=digest))
        begin, end = index.spans[start][0], index.spans[stop - 1][1]
        with opener.open(shard) as f:
            f.seek(begin)
            data = f.read(end - begin)
        records: Records = []
        for i in range(start, stop):
            if index.damage is not None and i == len(index.keys) - 1:
                if not skip_bad:
                    raise DataError(index.damage)
                records.append(BadRecord(index.damage))
                continue
            record = {"__key__": index.keys[i]}
            try:
                for ext, offset, size in index.members[i]:
                    if columns is None or ext in columns:
                        record[ext] = _value(ext, data[offset - begin : offset - begin + size])
            except ValueError as e:
                message = f"{shard.url}, sample {i} ({index.keys[i]!r}): {e}"
                if not skip_bad:
                    raise DataError(message) from None
                record = BadRecord(message)
            records.append(record)
        return ChunkRead(records, content_digest(data, algorithm=digest))


class _Blocks:
    """Reads a file in blocks of 1 MiB for the header scan: samples are small, so one block (one
    range request, for a remote file) holds many headers."""

    SIZE = 1 << 20

    def __init__(self, raw, size: int):
        self.raw, self.size, self.pos, self.at, self.block = raw, size, 0, 0, b""

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos if whence == 1 else self.size + pos
        return self.pos

    def read(self, n: int = -1) -> bytes:
        left = max(0, self.size - self.pos)
        n = left if n is None or n < 0 else min(n, left)
        if not self.at <= self.pos or self.pos + n > self.at + len(self.block):
            self.raw.seek(self.pos)
            self.at, self.block = self.pos, self.raw.read(max(n, self.SIZE))
        out = self.block[self.pos - self.at : self.pos - self.at + n]
        self.pos += len(out)
        return out


def _padded(size: int) -> int:
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _cut_member(shard: Shard, info: tarfile.TarInfo) -> tuple[str, str] | None:
    """(its sample's key, why) where the file ends inside member ``info`` or its padding."""
    end = info.offset_data + info.size
    if info.offset_data + _padded(info.size) <= shard.size:
        return None
    where = f"inside member {info.name!r}, whose data runs to byte {end:,}"
    if end <= shard.size:
        where = f"in the padding after member {info.name!r}, without the end-of-archive marker"
    return split_key(info.name)[0], f"truncated: the tar ends at byte {shard.size:,} {where}"


def _tail(shard: Shard, f: _Blocks, at: int, last: tarfile.TarInfo | None) -> tuple[str | None, str] | None:
    """(the key of the sample it damages, why) where the bytes after the last member, from
    ``at``, are not all zeros (the end-of-archive marker and padding) or not there."""
    after = f"after member {last.name!r}" if last is not None else "at its start"
    key = split_key(last.name)[0] if last is not None else None
    if at >= shard.size:
        return key, (
            f"truncated: the tar ends at byte {shard.size:,} {after}, without the end-of-archive marker "
            "(two zero blocks): members after it may be missing"
        )
    first = _first_nonzero(f, at, shard.size)
    if first is None:
        return None
    if first >= at + tarfile.BLOCKSIZE:
        return None, (
            f"trailing bytes: byte {first:,} is not zero, after the end-of-archive marker at byte {at:,} "
            "(garbage, or tars joined end to end: write one tar per shard)"
        )
    if shard.size - at < tarfile.BLOCKSIZE:
        return key, (
            f"truncated: the tar ends at byte {shard.size:,} inside the header at byte {at:,} {after} "
            f"(a header is {tarfile.BLOCKSIZE} bytes)"
        )
    return key, (
        f"the {tarfile.BLOCKSIZE} bytes at byte {at:,} {after} are not a valid tar header (damaged, or "
        f"garbage): bytes {at:,} to {shard.size:,} are not read"
    )


def _first_nonzero(f: _Blocks, start: int, stop: int) -> int | None:
    f.seek(start)
    while start < stop:
        block = f.read(_Blocks.SIZE)
        if not block:
            return start  # shorter than listed: not zeros
        stripped = block.lstrip(b"\0")
        if stripped:
            return start + len(block) - len(stripped)
        start += len(block)
    return None


def _value(ext: str, raw: bytes):
    last = ext.rpartition(".")[2].lower()
    try:
        if last in TEXT:
            return raw.decode("utf-8")
        if last == "json":
            return json.loads(raw)
        if last in INTS:
            return int(raw.decode("utf-8").strip())
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"member .{ext} is not valid {last} ({e})") from None
    return raw
