"""A counter of calls running at once, for tests of concurrency caps."""

from __future__ import annotations

import threading
import time


class InFlight:
    """``with counter:`` around a call; ``most`` is the largest number seen inside at once."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self._lock = threading.Lock()

    def __enter__(self) -> InFlight:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self.now -= 1

    def hold(self, seconds: float = 0.02) -> None:
        """One call that stays inside for ``seconds``."""
        with self:
            time.sleep(seconds)
