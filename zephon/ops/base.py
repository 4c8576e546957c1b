"""Operators: an ordered, per-lane accumulator that decides, and a stateless function that works.

Records arrive at an operator in order. Its accumulator (single-threaded, one per lane and flush
window) makes every stateful decision and emits *work units*; the operator's ``work`` function
turns a unit into output and may run on any worker of any runner, because the units are numbered
before they leave and put back in order after. At a flush the accumulator emits what it holds and
is replaced by a fresh one, so no operator carries state across a window boundary.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar


class Accumulator(ABC):
    """Per-lane, per-window decisions. ``push`` and ``flush`` return work units, in order."""

    @abstractmethod
    def push(self, item: Any) -> list[Any]: ...

    def flush(self) -> list[Any]:
        return []


class Passthrough(Accumulator):
    """The accumulator of a stateless operator: every item is one unit of work."""

    def push(self, item: Any) -> list[Any]:
        return [item]


class Operator(ABC):
    """One step of a pipeline. Subclasses set ``kind`` and the container types they take/give."""

    kind: ClassVar[str]
    takes: ClassVar[tuple[str, ...]]  # container names accepted: "records", "docs", "rows"
    gives: ClassVar[str | None]  # container name produced; None: same as the input
    stateless: ClassVar[bool] = False
    default_parallelism: ClassVar[int] = 0  # 0: run in the lane's own thread

    def __init__(self, parallelism: int | None = None):
        p = self.default_parallelism if parallelism is None else parallelism
        if not isinstance(p, int) or p < 0:
            raise ValueError(f"{self.kind}: parallelism must be an int >= 0, got {parallelism!r}")
        self.parallelism = p

    def accumulator(self, lane: int, window: int) -> Accumulator:
        return Passthrough()

    @abstractmethod
    def work(self, unit: Any) -> Any:
        """Turn one unit into output (a container, or None for nothing). Must be stateless."""

    @abstractmethod
    def params(self) -> dict:
        """Everything that shapes this operator's output, JSON-safe, for the recipe fingerprint."""

    def output(self, given: str) -> str:
        return self.gives or given
