"""File formats: how a shard is planned into chunks and how a chunk is read into records."""

from zephon.io.formats.arrow import ArrowFormat
from zephon.io.formats.base import BadRecord, ChunkRead, DataError, Format, Records
from zephon.io.formats.imagefolder import ImageFolderFormat
from zephon.io.formats.lines import JsonLinesFormat, TextFormat
from zephon.io.formats.parquet import ParquetFormat
from zephon.io.formats.webdataset import WebDatasetFormat

__all__ = [
    "ArrowFormat",
    "BadRecord",
    "ChunkRead",
    "DataError",
    "Format",
    "ImageFolderFormat",
    "JsonLinesFormat",
    "ParquetFormat",
    "Records",
    "TextFormat",
    "WebDatasetFormat",
    "format_for",
]

_SUFFIXES: list[tuple[str, str]] = [
    (".jsonl", "jsonl"),
    (".json", "jsonl"),
    (".ndjson", "jsonl"),
    (".parquet", "parquet"),
    (".arrow", "arrow"),
    (".feather", "arrow"),
    (".ipc", "arrow"),
    (".txt", "text"),
    (".text", "text"),
    (".tar", "webdataset"),
]
_COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
FORMATS = {
    "jsonl": JsonLinesFormat,
    "parquet": ParquetFormat,
    "arrow": ArrowFormat,
    "text": TextFormat,
    "webdataset": WebDatasetFormat,
    "imagefolder": ImageFolderFormat,
}


def split_suffix(url: str) -> tuple[str | None, str | None]:
    """(format name, compression) implied by a file name, or (None, None) if unknown."""
    lower = url.lower()
    compression = None
    for suffix, codec in _COMPRESSIONS.items():
        if lower.endswith(suffix):
            compression, lower = codec, lower[: -len(suffix)]
            break
    for suffix, name in _SUFFIXES:
        if lower.endswith(suffix):
            return name, compression
    return None, None


def format_for(name: str, compression: str | None) -> Format:
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}; known formats: {sorted(FORMATS)}")
    if compression and name not in ("jsonl", "text"):
        raise ValueError(f"compressed {name} files are not supported; only JSON lines and text")
    return FORMATS[name](compression)
