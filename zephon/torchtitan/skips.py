"""Skipping the data of training steps: ``[data] skip_steps = ["1200-1300", "7"]`` in a job
config, ``--dataloader.skip_steps 1200-1300,7`` on the command line.

Ranges count training steps (1-based, inclusive; ``"7"`` is ``"7-7"``). When training step ``a``
of a range ``a-b`` is about to get its data, the loader consumes and drops the data of
``b - a + 1`` steps and delivers the next: step ``a`` trains on what a run without skips gave at
step ``b + 1`` plus any earlier skips, and every later step is shifted by the total skipped.

What the loader's checkpoint records (in its ``meta``), so that a resume on any DP size agrees on
which data each later step gets::

    "skips": {"configured": ["3-4"], "applied": [[3, 4]], "data_steps": 2}

On resume the applied ranges stay applied (their data was consumed), a configured range that
starts at or before the resumed step and was not applied is ignored with a warning, later ranges
apply.
"""

from __future__ import annotations

import itertools
import logging
import re

log = logging.getLogger(__name__)

SETTING = "[data] skip_steps (--dataloader.skip_steps)"
_RANGE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")


def parse_skip_steps(entries) -> list[tuple[int, int]]:
    """``["1200-1300", "7"]`` -> ``[(7, 7), (1200, 1300)]``, sorted; ValueError naming the entry."""
    if isinstance(entries, str) or not isinstance(entries, list | tuple):
        raise ValueError(f'{SETTING} = {entries!r}: give a list of step ranges, e.g. ["1200-1300", "7"]')
    ranges = []
    for entry in entries:
        match = _RANGE.fullmatch(str(entry)) if isinstance(entry, str | int) else None
        if match is None or isinstance(entry, bool):
            raise ValueError(
                f'{SETTING}: {entry!r} is not a step range; write "FIRST-LAST" (e.g. "1200-1300") or "STEP"'
            )
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if first < 1:
            raise ValueError(f"{SETTING}: {entry!r}: training steps count from 1")
        if last < first:
            raise ValueError(f"{SETTING}: {entry!r}: the first step is after the last; write {last}-{first}")
        ranges.append((first, last))
    ranges.sort()
    for (a, b), (c, d) in itertools.pairwise(ranges):
        if c <= b:
            first, second = range_text((a, b)), range_text((c, d))
            raise ValueError(f"{SETTING}: {first!r} and {second!r} overlap; merge them")
    return ranges


def range_text(r: tuple[int, int]) -> str:
    return str(r[0]) if r[0] == r[1] else f"{r[0]}-{r[1]}"


class SkipPlan:
    """Which step ranges a loader skips: configured, applied so far, and data steps skipped."""

    def __init__(self, entries):
        self.configured = parse_skip_steps(list(entries))
        self.applied: list[tuple[int, int]] = []
        self.ignored: set[tuple[int, int]] = set()

    @property
    def data_steps(self) -> int:
        """Data steps skipped so far: the shift between training and data step numbers."""
        return sum(b - a + 1 for a, b in self.applied)

    def due(self, step: int) -> tuple[int, int] | None:
        """The range to apply before training step ``step`` gets its data, if any."""
        for r in self.configured:
            if r[0] == step and r not in self.applied and r not in self.ignored:
                return r
        return None

    def apply(self, r: tuple[int, int]) -> None:
        self.applied.append(r)

    def state(self) -> dict:
        return {
            "configured": [range_text(r) for r in self.configured],
            "applied": [list(r) for r in self.applied],
            "data_steps": self.data_steps,
        }

    def load(self, saved: dict | None, resumed_step: int) -> None:
        """Adopt a checkpoint's record (None: saved before skips existed, none applied) at
        ``resumed_step``, the last step trained; warn where the configured ranges changed."""
        saved = saved or {"configured": [], "applied": [], "data_steps": 0}
        self.applied = [tuple(r) for r in saved["applied"]]
        if self.data_steps != saved["data_steps"]:
            raise ValueError(
                f"the checkpoint's record of skipped steps is inconsistent ({saved}): the ranges applied "
                "skip a different number of steps than it says; was the checkpoint edited?"
            )
        before, now = saved["configured"], [range_text(r) for r in self.configured]
        if before != now:
            log.warning(
                "zephon: %s changed since the checkpoint: was %s, now %s (added %s, removed %s)",
                SETTING, before, now, sorted(set(now) - set(before)), sorted(set(before) - set(now)),
            )  # fmt: skip
        for r in self.applied:
            if r not in self.configured:
                log.warning(
                    "zephon: steps %s were skipped before the checkpoint and stay skipped (their data "
                    "was consumed), though %s no longer lists them", range_text(r), SETTING,
                )  # fmt: skip
        self.ignored = {r for r in self.configured if r[0] <= resumed_step and r not in self.applied}
        for r in sorted(self.ignored):
            log.warning(
                "zephon: %s: %r is ignored: it starts at or before step %d, where this run resumes, "
                "and was not applied before the checkpoint", SETTING, range_text(r), resumed_step,
            )  # fmt: skip
