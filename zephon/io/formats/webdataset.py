"""WebDataset tar shards: the files of one sample share a key (``dir/0001.jpg``, ``dir/0001.txt``).

A sample is a record ``{"__key__": key, ext: value, ...}``: ``txt``-like members become strings,
``json`` members parsed JSON, ``cls`` members ints, the rest (images) bytes. Chunks are ranges of
samples, planned from the tar headers (an index of each sample's byte span, read once per file and
process: one pass over the headers, skipping the member data); reading a chunk is one range read.
"""

from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass

from zephon.io.chunks import Shard, rows_within, split_range
from zephon.io.formats.base import LRU, BadRecord, DataError, Format, Records

_INDEXES = LRU(64)
TEXT = ("txt", "text", "caption", "cap")
INTS = ("cls", "cls2", "index")


@dataclass(frozen=True, slots=True)
class TarIndex:
    """Each sample's key, its members ``(ext, offset, size)`` and its byte span in the file."""

    keys: list[str]
    members: list[list[tuple[str, int, int]]]
    spans: list[tuple[int, int]]


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
                for info in tar:
                    if not info.isfile():
                        continue
                    key, ext = split_key(info.name)
                    if not keys or keys[-1] != key:
                        keys.append(key)
                        members.append([])
                        spans.append((info.offset, info.offset_data + info.size))
                    members[-1].append((ext, info.offset_data, info.size))
                    spans[-1] = (spans[-1][0], info.offset_data + info.size)
            except tarfile.TarError as e:
                raise DataError(f"{shard.url}: not a readable tar file ({e})") from None
        if len(set(keys)) != len(keys):
            dup = next(k for i, k in enumerate(keys) if k in keys[:i])
            raise DataError(
                f"{shard.url}: the files of sample {dup!r} are not next to each other in the tar; "
                "write each sample's files together (as WebDataset's writers do)"
            )
        return TarIndex(keys, members, spans)

    def schema_names(self, shard: Shard, opener) -> list[str] | None:
        """``__key__`` and the first sample's extensions."""
        index = self.index(shard, opener)
        return ["__key__", *(ext for ext, _, _ in index.members[0])] if index.keys else None

    def rows(self, shard: Shard, opener) -> int:
        return len(self.index(shard, opener).keys)

    def plan(self, shard: Shard, chunk_size: int, chunk_bytes: int, opener) -> list[tuple[int, int]]:
        n = self.rows(shard, opener)
        return split_range(0, n, rows_within(chunk_size, chunk_bytes, n, shard.size)) if n else []

    def read(self, shard, start, stop, columns, opener, skip_bad: bool = False) -> Records:
        index = self.index(shard, opener)
        if start >= stop:
            return []
        begin, end = index.spans[start][0], index.spans[stop - 1][1]
        with opener.open(shard) as f:
            f.seek(begin)
            data = f.read(end - begin)
        records: Records = []
        for i in range(start, stop):
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
        return records


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
        n = self.size - self.pos if n is None or n < 0 else min(n, self.size - self.pos)
        if not self.at <= self.pos or self.pos + n > self.at + len(self.block):
            self.raw.seek(self.pos)
            self.at, self.block = self.pos, self.raw.read(max(n, self.SIZE))
        out = self.block[self.pos - self.at : self.pos - self.at + n]
        self.pos += len(out)
        return out


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
