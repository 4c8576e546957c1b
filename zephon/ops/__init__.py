"""Operators: each an ordered per-lane accumulator plus a stateless work function."""

from zephon.ops.base import Accumulator, Operator, Passthrough
from zephon.ops.batch import BatchRows
from zephon.ops.containers import Docs, RecordBlock, Rows
from zephon.ops.pack import PackFlat
from zephon.ops.records import Filter, Map, Read
from zephon.ops.shuffle import Shuffle
from zephon.ops.tokenize import Tokenize

__all__ = [
    "Accumulator",
    "BatchRows",
    "Docs",
    "Filter",
    "Map",
    "Operator",
    "PackFlat",
    "Passthrough",
    "Read",
    "RecordBlock",
    "Rows",
    "Shuffle",
    "Tokenize",
]
