"""Deterministic mixing: each step takes from the dataset furthest behind its target share.

With ``used[d]`` the units (records or tokens) a lane has taken from dataset ``d`` and ``U`` their
sum, the next chunk comes from ``argmax_d(share[d] * U - used[d])``, ties to the lower index. Unlike
a random draw per chunk, the realized share of every dataset stays within about one chunk of its
target at every point of the stream, on every lane.
"""

from __future__ import annotations


def pick(shares: list[float], used: list[float]) -> int:
    total = sum(used)
    best, best_deficit = 0, None
    for d, (share, u) in enumerate(zip(shares, used, strict=True)):
        deficit = share * total - u
        if best_deficit is None or deficit > best_deficit:
            best, best_deficit = d, deficit
    return best


def normalize(weights: dict[str, float], names: list[str]) -> list[float]:
    """Weights for ``names`` (in order), checked and scaled to sum to 1."""
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ValueError(f"mixture names unknown dataset(s) {unknown}; datasets are {names}")
    missing = [n for n in names if n not in weights]
    if missing:
        raise ValueError(f"mixture gives no weight for dataset(s) {missing}")
    values = []
    for n in names:
        w = weights[n]
        if not isinstance(w, int | float) or not w > 0 or w != w or w == float("inf"):
            raise ValueError(f"mixture weight for {n!r} must be a positive number, got {w!r}")
        values.append(float(w))
    total = sum(values)
    return [v / total for v in values]
