"""Where a lane's work source stands, and the feedback of actual units from the workers.

A mixture pick uses the *actual* units (tokens or records that the pipeline made) of every chunk
older than ``LAG`` chunks, and estimates only for the last ``LAG``: their size times the rate
(units per byte or row) the lane has actually seen of that dataset so far, starting from the
measured rate. Picks therefore follow what was really delivered, even when the measured rate is
off or documents are lumpy next to the chunk size, yet the source may run ``LAG`` chunks ahead
of the workers. Which chunks count as actual depends only on positions, never on timing, so the
picks are a pure function of the recipe.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from zephon.io import Chunk

LAG = 16  # part of the plan: changing it changes which chunks a lane reads


class Pending:
    """The actual units of one chunk of dataset ``dataset``, set when its work is done."""

    __slots__ = ("_event", "dataset", "value")

    def __init__(self, dataset: int, value: int | None = None):
        self.dataset, self.value = dataset, value
        self._event = threading.Event()
        if value is not None:
            self._event.set()

    def set(self, value: int) -> None:
        self.value = value
        self._event.set()

    def wait(self) -> int:
        self._event.wait()
        return self.value


@dataclass(slots=True)
class Work:
    """A chunk for the workers, with where to report its actual units (None: not needed)."""

    chunk: Chunk
    pending: Pending | None


@dataclass(slots=True)
class Cursor:
    """A lane's work source at a window start. JSON: ``{"taken", "used", "sizes", "recent"}``.

    ``taken``: chunks taken from each dataset; ``used`` and ``sizes``: actual units and total size
    of each dataset's chunks older than the lag; ``recent``: the last chunks (at most LAG,
    oldest first) as ``[dataset, actual units]``.
    """

    taken: list[int]
    used: list[int]
    sizes: list[int]
    recent: list[Pending]

    @staticmethod
    def start(num_datasets: int) -> Cursor:
        return Cursor([0] * num_datasets, [0] * num_datasets, [0] * num_datasets, [])

    def to_json(self) -> dict:
        # only called for windows whose batches were delivered: their chunks are all done
        recent = [[p.dataset, p.wait()] for p in self.recent]
        return {
            "taken": list(self.taken),
            "used": list(self.used),
            "sizes": list(self.sizes),
            "recent": recent,
        }

    @staticmethod
    def from_json(data: dict, num_datasets: int) -> Cursor:
        lists = [data.get(k) for k in ("taken", "used", "sizes")]
        recent = data.get("recent")
        if any(not isinstance(v, list) or len(v) != num_datasets for v in lists) or not isinstance(
            recent, list
        ):
            raise ValueError(f"lane cursor {data} does not match {num_datasets} datasets")
        if len(recent) > LAG or any(not 0 <= int(d) < num_datasets for d, _ in recent):
            raise ValueError(f"lane cursor {data}: bad recent chunks")
        taken, used, sizes = ([int(x) for x in v] for v in lists)
        return Cursor(taken, used, sizes, [Pending(int(d), int(v)) for d, v in recent])
