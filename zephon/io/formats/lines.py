"""Line formats: JSON lines and plain text, plain or compressed.

A plain file is chunked by byte ranges from its size alone; a chunk owns the lines whose first
byte lies inside its range, so every line belongs to exactly one chunk whatever the chunk size.
Reading a chunk costs one range request (two when its last line runs past the range). A
compressed file cannot be read from the middle: its dataset decompresses it once into the local
cache (``zephon.io.plain``) and plans and reads that copy.
"""

from __future__ import annotations

import json

import msgspec
import numpy as np

from zephon.io.chunks import Group, Shard
from zephon.io.formats.base import BadRecord, ChunkRead, DataError, Format, Records, content_digest

_TAIL = 64 << 10  # read-ahead to finish a chunk's last line, where the file does not say (``tail``)
_SCAN = json.scanner.make_scanner(json.JSONDecoder())
_JSON_SPACE = " \t\r"  # what json.loads allows around a value (and the \n we split on)
_BLANK = " \t\n\r\x0b\x0c"  # what bytes.strip() removes: a line of these is no record
_LINES = msgspec.json.Decoder().decode_lines
try:  # the lines' check compiled (setup.py): the same answer as objects_per_line, in one pass
    from zephon.io.formats._lines import objects_per_line as _objects_per_line
except ImportError:  # not built (no C compiler at install)
    _objects_per_line = None


class _LineFormat(Format):
    unit = "bytes"

    def groups(self, shard: Shard, opener) -> list[Group]:
        assert not self.compression, "compressed files are planned through their plain copy"
        return [(0, shard.size, shard.size)]  # from the listing: nothing read

    def read(
        self, shard, start, stop, columns, opener, skip_bad: bool = False, digest: str = "xxh3"
    ) -> ChunkRead:
        assert not self.compression, "compressed files are read through their plain copy"
        with opener.ranges(shard) as f:
            first, data = _owned_lines(f, start, stop)
        return ChunkRead(
            self.parse_lines(shard, first, data, columns, opener, skip_bad),
            content_digest(data, algorithm=digest),
        )

    def parse_lines(self, shard, first: int, data: bytes, columns, opener, skip_bad: bool) -> Records:
        """The records of the lines ``data`` (which start at byte ``first`` of ``shard``)."""
        records = self.parse_all(data, columns)
        if records is not None:
            return records
        records, base = [], None  # a line the quick path does not take: find it and say what is wrong
        for number, line in enumerate(data.split(b"\n")):
            if line.strip():
                try:
                    records.append(self.parse(line, columns))
                except (ValueError, UnicodeDecodeError) as e:
                    if skip_bad:
                        records.append(BadRecord(str(e)))
                        continue
                    base = _line_number(shard, first, opener) if base is None else base
                    raise DataError(f"{shard.url}, line {base + number}: {e}") from None
        return records

    def parse(self, line: bytes, columns: tuple[str, ...] | None) -> dict:
        raise NotImplementedError

    def line_of(self, shard: Shard, start: int, stop: int, record: int, opener) -> int:
        """The 1-based line number of the ``record``-th record (non-blank line) of a chunk."""
        with opener.ranges(shard) as f:
            first, data = _owned_lines(f, start, stop)
        lines = [n for n, line in enumerate(data.split(b"\n")) if line.strip()]
        return _line_number(shard, first, opener) + lines[record]

    def parse_all(self, data: bytes, columns: tuple[str, ...] | None) -> Records | None:
        """Every record of ``data`` the quick way, or None where a line needs ``parse`` to say
        what is wrong with it."""
        return None


class JsonLinesFormat(_LineFormat):
    """One JSON object per line: ``.jsonl``, ``.json``, ``.ndjson``, plain, ``.gz`` or ``.zst``."""

    name = "jsonl"

    def parse(self, line: bytes, columns: tuple[str, ...] | None) -> dict:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"malformed JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise ValueError("JSON nested too deeply to read (thousands of levels)") from None
        if not isinstance(record, dict):
            hint = " (is this a JSON array file? write one object per line)" if line[:1] == b"[" else ""
            raise ValueError(f"expected a JSON object, got {type(record).__name__}{hint}")
        if columns is not None:
            missing = [c for c in columns if c not in record]
            if missing:
                raise ValueError(f"no column(s) {missing} in this record; its fields are {sorted(record)}")
            return {c: record[c] for c in columns}
        return record

    def parse_all(self, data: bytes, columns: tuple[str, ...] | None) -> Records | None:
        records = _whole_chunk(data)
        if records is None:
            try:
                records = _line_by_line(data.decode("utf-8"))
            except UnicodeDecodeError:
                return None
        if records is None or columns is None:
            return records
        try:
            return [{c: record[c] for c in columns} for record in records]
        except KeyError:
            return None


def _whole_chunk(data: bytes) -> Records | None:
    """The records of a chunk whose every line is one object, ``{`` first and ``}`` last (a
    ``\r`` after it allowed), in one call of msgspec's reader: four times json's speed on short
    lines. msgspec reads newlines as whitespace, so one object across two lines would pass it;
    here it cannot: inside an object or array, a ``}`` is never followed by a ``{``, so every
    newline lies between two objects, and with as many objects as lines, each line holds one.
    Where both readers take a text they give the same values; what msgspec refuses (NaN,
    Infinity, numbers out of a float's range, lone surrogates) goes to ``_line_by_line``. A
    text that is not all ASCII is decoded first, so that Python's UTF-8 decoder judges it."""
    lines = (_objects_per_line or objects_per_line)(data)
    if lines < 0:
        return None
    try:
        records = _LINES(data if data.isascii() else data.decode("utf-8"))
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    return records if len(records) == lines else None


def objects_per_line(data: bytes) -> int:
    """The number of lines of ``data`` (a last line without its newline counts) if each is
    ``{`` first and ``}`` last (one ``\r`` after it allowed, at least two bytes before it), else
    -1, and -1 for no data: ``_lines.c``'s twin, in numpy."""
    if not data:
        return -1
    raw = np.frombuffer(data, np.uint8)
    newlines = np.flatnonzero(raw == 10)
    starts = np.concatenate(([0], newlines[:-1] + 1)) if data[-1] == 10 else np.append(0, newlines + 1)
    ends = newlines - 1 if data[-1] == 10 else np.append(newlines, len(raw)) - 1
    ends -= raw[ends] == 13
    if not ((raw[starts] == 123).all() and (ends > starts).all() and (raw[ends] == 125).all()):
        return -1
    return len(starts)


def _line_by_line(text: str) -> Records | None:
    """json's own C scanner on each line: the same values as json.loads without its per-call
    checks; any doubt (None) goes back to ``parse``, line by line."""
    records, scan = [], _SCAN
    for line in text.split("\n"):
        line = line.strip(_JSON_SPACE)
        if not line.strip(_BLANK):
            if line:
                return None  # blank to bytes.strip but not JSON whitespace: let parse decide
            continue
        try:
            record, end = scan(line, 0)
        except (StopIteration, ValueError, RecursionError):
            return None
        if end != len(line) or type(record) is not dict:
            return None
        records.append(record)
    return records


class TextFormat(_LineFormat):
    """Plain text: every non-blank line is a record ``{"text": line}``."""

    name = "text"

    def parse(self, line: bytes, columns: tuple[str, ...] | None) -> dict:
        return {"text": line.rstrip(b"\r").decode("utf-8")}

    def parse_all(self, data: bytes, columns: tuple[str, ...] | None) -> Records | None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return [{"text": line.rstrip("\r")} for line in text.split("\n") if line.strip(_BLANK)]


def _owned_lines(f, start: int, stop: int) -> tuple[int, bytes]:
    """(first owned byte, bytes of the lines that start in ``[start, stop)``)."""
    if start == 0:
        first, data = 0, f.read(stop)
    else:
        f.seek(start - 1)
        head = f.read(stop - start + 1)  # one byte before the range tells if a line starts at `start`
        newline = head.find(b"\n")
        if newline < 0 or newline == len(head) - 1:
            return stop, b""  # no line starts inside the range
        first, data = start + newline, head[newline + 1 :]
    parts, step = [data], getattr(f, "tail", _TAIL)
    while data and not parts[-1].endswith(b"\n"):  # the last line starts inside: read it to its end
        more = f.read(step)
        step = min(2 * step, 64 << 20)  # few requests for a long line, and no quadratic copies
        if not more:
            break
        cut = more.find(b"\n")
        parts.append(more if cut < 0 else more[: cut + 1])
        if cut >= 0:
            break
    return first, b"".join(parts)


def _line_number(shard: Shard, offset: int, opener) -> int:
    """1-based number of the line starting at byte ``offset`` (only on the error path)."""
    count = 0
    with opener.open(shard) as f:
        remaining = offset
        while remaining > 0:
            block = f.read(min(1 << 20, remaining))
            if not block:
                break
            count += block.count(b"\n")
            remaining -= len(block)
    return count + 1
