"""Scheduled mixtures: weights that change over a run, as a pure function of what a lane took.

A schedule is a list of points ``(at, weights, ramp)``: ``at`` counts the run's delivered units
(tokens, or documents for a record mixture), the first point is at 0, and ``weights`` hold from
``at`` until the next point, or, when that next point says ``ramp="linear"``, move in a straight
line to its weights. After the last point its weights hold.

A lane does not know what other lanes took, but lanes take the same number of units in step,
so the run's count at a point of a lane is that lane's count times ``num_lanes``: the schedule
each lane follows is the run's, scaled by ``1 / num_lanes``. It depends on nothing but the
lane's own stream, so it is the same on any DP size, runner and resume point.

The mixer's rule stays "take from the dataset whose next piece is most overdue"; with fixed
shares dataset ``d`` is due for its ``u``-th unit when the lane has taken ``u / share[d]`` units,
with a schedule when the lane has taken ``x`` units such that ``target_d(x) = u``, where
``target_d(x)`` is the integral of ``d``'s weight over the lane's first ``x`` units
(:meth:`LaneSchedule.due`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zephon.work.mixture import normalize

RAMPS = ("step", "linear")


@dataclass(frozen=True, slots=True)
class Point:
    at: int
    shares: tuple[float, ...]
    ramp: str = "step"


class Schedule:
    """A run's mixture schedule over datasets ``names`` (see the module docstring)."""

    def __init__(self, points: list[dict], names: list[str]):
        if not isinstance(points, list | tuple) or not points:
            raise ValueError("a mixture schedule is a non-empty list of {at, weights[, ramp]} points")
        self.names, self.points = list(names), []
        for i, p in enumerate(points):
            self.points.append(_point(p, i, names, self.points[-1] if self.points else None))

    def to_json(self) -> list[dict]:
        return [{"at": p.at, "shares": list(p.shares), "ramp": p.ramp} for p in self.points]

    def for_lane(self, num_lanes: int) -> LaneSchedule:
        return LaneSchedule(self.points, num_lanes)


def _point(p, i: int, names: list[str], before: Point | None) -> Point:
    where = f"mixture schedule point {i + 1}"
    if not isinstance(p, dict) or set(p) - {"at", "weights", "ramp"} or not {"at", "weights"} <= set(p):
        raise ValueError(f"{where}: expected {{at = N, weights = {{name = w, ...}}, ramp = ...}}, got {p!r}")
    at, ramp = p["at"], p.get("ramp", "step")
    if isinstance(at, bool) or not isinstance(at, int | float) or not _whole(at) or at < 0:
        raise ValueError(f"{where}: at = {at!r} should be a whole number of units >= 0")
    if ramp not in RAMPS:
        raise ValueError(f"{where}: ramp = {ramp!r}, expected one of {RAMPS}")
    if before is None and (at != 0 or ramp != "step"):
        raise ValueError(f"{where}: the first point is at 0 (the start of the run) and does not ramp")
    if before is not None and at <= before.at:
        raise ValueError(f"{where}: at = {at} does not come after the point before it (at = {before.at})")
    try:
        shares = normalize(p["weights"], names, zero=True)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return Point(int(at), tuple(shares), ramp)


def _whole(at: float) -> bool:
    """A whole number a float can hold (not inf, NaN, or an int over the largest float)."""
    try:
        value = float(at)
    except OverflowError:
        return False
    return math.isfinite(value) and value == int(value)


class LaneSchedule:
    """One lane's view of a schedule: positions scaled by ``1 / num_lanes``; cumulative targets
    ``target_d(x)`` are piecewise quadratic (linear where weights hold) and inverted exactly."""

    def __init__(self, points: list[Point], num_lanes: int):
        self.x = [p.at / num_lanes for p in points]
        self.num = len(points[0].shares)
        # segment i spans [x[i], x[i + 1]); its weights go from a[i] to b[i]
        self.a = [list(p.shares) for p in points]
        self.b = [
            list(points[i + 1].shares)
            if i + 1 < len(points) and points[i + 1].ramp == "linear"
            else list(p.shares)
            for i, p in enumerate(points)
        ]
        self.cum = [[0.0] * self.num]  # target_d at each point
        for i in range(len(points) - 1):
            length = self.x[i + 1] - self.x[i]
            self.cum.append(
                [c + (a + b) / 2 * length for c, a, b in zip(self.cum[i], self.a[i], self.b[i], strict=True)]
            )

    def weights(self, x: float) -> list[float]:
        i = self._segment(x)
        if i + 1 >= len(self.x):
            return list(self.a[i])
        t = (x - self.x[i]) / (self.x[i + 1] - self.x[i])
        return [a + (b - a) * t for a, b in zip(self.a[i], self.b[i], strict=True)]

    def target(self, d: int, x: float) -> float:
        """Units of dataset ``d`` due once the lane has taken ``x`` units."""
        i = self._segment(x)
        s, a = x - self.x[i], self.a[i][d]
        if i + 1 >= len(self.x):
            return self.cum[i][d] + a * s
        slope = (self.b[i][d] - a) / (self.x[i + 1] - self.x[i])
        return self.cum[i][d] + a * s + slope * s * s / 2

    def due(self, d: int, units: float) -> float:
        """The smallest ``x`` with ``target(d, x) >= units``: when the lane owes ``d`` that many
        units (infinite if ``d``'s weight stays 0 from some point on and never gets there)."""
        if units <= 0:
            return 0.0
        last = len(self.x) - 1
        i = 0
        while i < last and self.cum[i + 1][d] < units:
            i += 1
        rest, a = units - self.cum[i][d], self.a[i][d]
        if i == last:
            return self.x[i] + rest / a if a > 0 else math.inf
        half_slope = (self.b[i][d] - a) / (self.x[i + 1] - self.x[i]) / 2
        # a s + half_slope s^2 = rest, the root in the segment, written to be stable when a ~ 0
        return self.x[i] + 2 * rest / (a + math.sqrt(max(0.0, a * a + 4 * half_slope * rest)))

    def _segment(self, x: float) -> int:
        i = 0
        while i + 1 < len(self.x) and self.x[i + 1] <= x:
            i += 1
        return i
