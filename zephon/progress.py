"""A periodic progress log line (rate and ETA) for long work: planning, estimation."""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("zephon")


class Progress:
    """``update()`` after each item; logs at most every ``every`` seconds, and at the end of
    work that took a second or more."""

    def __init__(self, what: str, total: int, unit: str, every: float = 5.0):
        self.what, self.total, self.unit, self.every = what, total, unit, every
        self.done, self.start = 0, time.monotonic()
        self.last = self.start
        self.lock = threading.Lock()

    def update(self, n: int = 1) -> None:
        with self.lock:
            self.done += n
            now = time.monotonic()
            if now - self.last < (self.every if self.done < self.total else 1.0):
                return  # quick work ends without a line
            self.last = now
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate else float("inf")
        log.info(
            "zephon: %s: %d/%d %s, %.1f %s/s, ETA %.0fs",
            self.what, self.done, self.total, self.unit, rate, self.unit, eta,
        )  # fmt: skip
