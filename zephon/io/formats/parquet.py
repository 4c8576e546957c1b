"""Parquet: chunks are row ranges inside one row group, planned from the footer alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zephon.io.chunks import Group, Shard
from zephon.io.formats.base import LRU, ChunkRead, DataError, Format, content_digest

if TYPE_CHECKING:  # pyarrow is imported where a Parquet file is read: not at zephon's import
    import pyarrow as pa
    import pyarrow.parquet as pq

_FOOTERS = LRU(256)
TAIL = 64 << 10  # the bytes read from a file's end for its footer: most footers fit
# decoded row groups, shared by the process's threads: a row group of images (a few MB) holds many
# chunks, which different lanes and workers read; bounded by bytes, as text row groups can be large
_ROW_GROUPS = LRU(16, max_bytes=512 << 20, weigh=lambda table: table.nbytes)


def _tail(f, size: int, n: int) -> bytes:
    """The last ``n`` bytes of the open file ``f`` of ``size`` bytes (all of a smaller one)."""
    f.seek(max(0, size - n))
    return f.read(n)


def row_group_bounds(metadata: pq.FileMetaData) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for i in range(metadata.num_row_groups):
        n = metadata.row_group(i).num_rows
        bounds.append((start, start + n))
        start += n
    return bounds


class ParquetFormat(Format):
    name = "parquet"
    unit = "rows"

    def footer(self, shard: Shard, opener) -> pq.FileMetaData:
        """The file's metadata, read with one request where it fits in the file's last 64 KiB
        (the size is the listing's): a plan of a million files asks the store a million times,
        not two million."""
        key = (shard.url, shard.size, shard.version)
        metadata = _FOOTERS.get(key)
        if metadata is None:
            import pyarrow as pa
            import pyarrow.parquet as pq

            with opener.open(shard) as f:
                tail = _tail(f, shard.size, TAIL)
                need = int.from_bytes(tail[-8:-4], "little") + 8 if len(tail) >= 8 else 0
                if len(tail) < need <= shard.size:  # a footer larger than the tail: the rest of it
                    tail = _tail(f, shard.size, need)
            try:
                metadata = pq.ParquetFile(pa.BufferReader(tail)).metadata
            except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
                raise DataError(f"{shard.url}: not a readable Parquet file ({e})") from None
            _FOOTERS.put(key, metadata)
        return metadata

    def schema_names(self, shard: Shard, opener) -> list[str]:
        return list(self.footer(shard, opener).schema.to_arrow_schema().names)

    def groups(self, shard: Shard, opener) -> list[Group]:
        metadata = self.footer(shard, opener)
        return [
            (start, stop, metadata.row_group(i).total_byte_size)
            for i, (start, stop) in enumerate(row_group_bounds(metadata))
        ]

    def read(
        self, shard, start, stop, columns, opener, skip_bad: bool = False, digest: str = "xxh3"
    ) -> ChunkRead:
        bounds = row_group_bounds(self.footer(shard, opener))
        group = next(i for i, (a, b) in enumerate(bounds) if a <= start < b)
        table = self._row_group(shard, group, columns, opener)
        piece = table.slice(start - bounds[group][0], stop - start)
        digest = content_digest(*(batch.serialize() for batch in piece.to_batches()), algorithm=digest)
        return ChunkRead(piece.to_pylist(), digest)

    def _row_group(self, shard, group, columns, opener) -> pa.Table:
        # the chunks of one row group are read by several lanes and workers: decode it once
        key = (shard.url, shard.size, shard.version, group, columns)
        table = _ROW_GROUPS.get(key)
        if table is None:
            with opener.open(shard) as f:
                import pyarrow.parquet as pq

                pf = pq.ParquetFile(f, metadata=self.footer(shard, opener))
                table = pf.read_row_group(group, columns=list(columns) if columns else None)
            _ROW_GROUPS.put(key, table)
        return table
