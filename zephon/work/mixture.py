"""Deterministic mixing: the next chunk comes from the dataset whose next chunk is most overdue.

With ``used[d]`` the units (records or tokens) a lane has taken from dataset ``d`` and
``next[d]`` the units of its next chunk, the next pick is ``argmin_d (used[d] + next[d] / 2) /
share[d]``, ties to the lower index: the chunk whose middle falls earliest on the ideal
schedule. Unlike a random draw per chunk, every dataset's realized share stays within about one
chunk of its target at every point of the stream, on every lane; and unlike "most behind
first", it does not overshoot the datasets with big chunks on average.
"""

from __future__ import annotations


def pick(shares: list[float], used: list[float], upcoming: list[float]) -> int:
    best, best_key = 0, None
    for d, (share, u, n) in enumerate(zip(shares, used, upcoming, strict=True)):
        key = (u + n / 2) / share
        if best_key is None or key < best_key:
            best, best_key = d, key
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
