"""The inline runner: everything in the consumer's thread, nothing ahead. For debugging."""

from __future__ import annotations

from zephon.runners.base import Executor, InlineExecutor, Runner


class InlineRunner(Runner):
    name = "inline"
    background = False

    def executor(self, work, parallelism: int, timeout: float) -> Executor:
        return InlineExecutor(work)
