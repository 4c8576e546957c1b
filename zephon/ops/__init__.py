"""Operators: stateless work on the workers (read, map, filter, tokenize), and the lane's ordered
decisions (pack_flat, shuffle, batch)."""

from zephon.ops.base import Operator, WorkOperator
from zephon.ops.batch import BatchRows
from zephon.ops.containers import Docs, RecordBlock, Rows
from zephon.ops.images import Images
from zephon.ops.pack import PackFlat
from zephon.ops.records import Filter, Map, Read
from zephon.ops.shuffle import Shuffle
from zephon.ops.tokenize import Tokenize

__all__ = [
    "BatchRows",
    "Docs",
    "Filter",
    "Images",
    "Map",
    "Operator",
    "PackFlat",
    "Read",
    "RecordBlock",
    "Rows",
    "Shuffle",
    "Tokenize",
    "WorkOperator",
]
