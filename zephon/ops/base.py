"""Operators: stateless work on the workers, ordered decisions in the lane.

Record operators and the tokenizer (:class:`WorkOperator`) are stateless: each turns one chunk's
container into another and may run on any worker of any runner, because chunks are numbered
before they leave and put back in order after. Consecutive ones run fused, one task per chunk.

Packing, shuffling and batching are the lane's own ordered decisions (single-threaded, one lane
at a time): they work on one window of rows at a time and keep nothing across windows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar


class Operator(ABC):
    """One step of a pipeline. Subclasses set ``kind`` and the container types they take/give."""

    kind: ClassVar[str]
    takes: ClassVar[tuple[str, ...]]  # container names accepted: "records", "docs", "rows"
    gives: ClassVar[str | None]  # container name produced; None: same as the input
    stateless: ClassVar[bool] = False

    @abstractmethod
    def params(self) -> dict:
        """Everything that shapes this operator's output, JSON-safe, for the recipe fingerprint."""

    def output(self, given: str) -> str:
        return self.gives or given


class WorkOperator(Operator):
    """A stateless operator: ``work`` runs on the workers, one unit (a chunk's data) at a time."""

    stateless = True
    default_parallelism: ClassVar[int] = 1

    def __init__(self, parallelism: int | None = None):
        p = self.default_parallelism if parallelism is None else parallelism
        if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p <= 512:
            raise ValueError(f"{self.kind}: parallelism must be an int from 0 to 512, got {parallelism!r}")
        self.parallelism = p

    @abstractmethod
    def work(self, unit: Any) -> Any:
        """Turn one unit into output. Must be stateless."""

    # modules ``work`` needs that a worker process would otherwise import itself: the process
    # runner's fork server imports them once, and its workers start with them (their pages shared)
    imports: tuple[str, ...] = ()
    # the tokenizers ``work`` loads, as (tokenizer_id, backend): the fork server loads them once,
    # and its workers start with them loaded (zephon.runners.preload)
    tokenizers: tuple[tuple[str, str], ...] = ()
    # where most of ``work`` holds the GIL, what does and what to choose instead: thread workers
    # would take turns at it, and the thread runner says so (None: it lets go of it)
    holds_gil: str | None = None

    def prepare(self) -> None:
        """Load what ``work`` needs, so that the first unit does not wait for it (a worker
        process calls this before it takes work)."""
