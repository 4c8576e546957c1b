"""Runners: inline, thread, process. The only place where concurrency lives."""

from zephon.runners.background import LaneDriver
from zephon.runners.base import Executor, InlineExecutor, Runner
from zephon.runners.inline import InlineRunner
from zephon.runners.process import ProcessRunner, check_picklable
from zephon.runners.thread import ThreadRunner, planning_map, thread_map

RUNNERS = {"inline": InlineRunner, "thread": ThreadRunner, "process": ProcessRunner}


def get_runner(name: str) -> Runner:
    if name not in RUNNERS:
        raise ValueError(f"unknown runner {name!r}; expected one of {sorted(RUNNERS)}")
    return RUNNERS[name]()


__all__ = [
    "RUNNERS",
    "Executor",
    "InlineExecutor",
    "InlineRunner",
    "LaneDriver",
    "ProcessRunner",
    "Runner",
    "ThreadRunner",
    "check_picklable",
    "get_runner",
    "planning_map",
    "thread_map",
]
