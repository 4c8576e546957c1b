"""I/O: datasets, file formats and filesystems."""

from zephon.io.chunks import Chunk, ChunkTable, Shard
from zephon.io.dataset import Dataset
from zephon.io.formats import DataError, Records
from zephon.io.remote import ChangedFileError, IOConfig, RemoteUnavailableError
from zephon.io.tokenizer import TextTokenizer, load_tokenizer

__all__ = [
    "ChangedFileError",
    "Chunk",
    "ChunkTable",
    "DataError",
    "Dataset",
    "IOConfig",
    "Records",
    "RemoteUnavailableError",
    "Shard",
    "TextTokenizer",
    "load_tokenizer",
]
