"""I/O: datasets, file formats and filesystems."""

from zephon.io.chunks import Chunk, ChunkTable, Shard
from zephon.io.dataset import Dataset
from zephon.io.formats import DataError, Records

__all__ = ["Chunk", "ChunkTable", "DataError", "Dataset", "Records", "Shard"]
