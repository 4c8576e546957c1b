"""Arrow IPC files (file or stream format): chunks are row ranges inside one record batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zephon.io.chunks import Group, Shard
from zephon.io.formats.base import LRU, ChunkRead, Format, content_digest

if TYPE_CHECKING:  # pyarrow is imported where an Arrow file is read: not at zephon's import
    import pyarrow as pa

_OPENED = LRU(8)  # per process: record batches of recently read files (memory-mapped if local)


def _batches(shard: Shard, opener) -> list[pa.RecordBatch]:
    key = (shard.url, shard.size, shard.version)
    batches = _OPENED.get(key)
    if batches is None:
        batches = _open_batches(shard, opener)
        _OPENED.put(key, batches)
    return batches


def _open_batches(shard: Shard, opener) -> list[pa.RecordBatch]:
    import pyarrow as pa

    if opener.is_remote(shard.url):
        with opener.open(shard) as f:
            source = pa.BufferReader(f.read())
    else:
        source = pa.memory_map(shard.url.removeprefix("file://"))  # zero-copy for local files
    try:
        reader = pa.ipc.open_file(source)
        return [reader.get_batch(i) for i in range(reader.num_record_batches)]
    except pa.ArrowInvalid:  # not the file format: an IPC stream, as `datasets` caches write
        source.seek(0)
        return list(pa.ipc.open_stream(source))


class ArrowFormat(Format):
    name = "arrow"
    unit = "rows"

    def schema_names(self, shard: Shard, opener) -> list[str]:
        batches = _batches(shard, opener)
        return list(batches[0].schema.names) if batches else []

    def groups(self, shard: Shard, opener) -> list[Group]:
        groups, start = [], 0
        for batch in _batches(shard, opener):
            groups.append((start, start + batch.num_rows, batch.nbytes))
            start += batch.num_rows
        return groups

    def read(
        self, shard, start, stop, columns, opener, skip_bad: bool = False, digest: str = "xxh3"
    ) -> ChunkRead:
        offset = 0
        for batch in _batches(shard, opener):
            if offset <= start < offset + batch.num_rows:
                piece = batch.slice(start - offset, stop - start)
                if columns:
                    piece = piece.select(list(columns))
                return ChunkRead(piece.to_pylist(), content_digest(piece.serialize(), algorithm=digest))
            offset += batch.num_rows
        raise ValueError(f"{shard.url}: rows [{start}, {stop}) are past the end of the file")
