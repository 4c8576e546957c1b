"""Attention cost of packed rows, and an order of a window's rows that evens it out over time.

With per-document masks a row's attention cost is the query-key pairs of its documents: a run of
``n`` tokens from position 0 costs ``n (n + 1) / 2`` (causal). Rows of long documents cost many
times rows of short ones, so the ranks of one step, each holding a few rows, do unequal work.

:func:`balanced_order` reorders a window's rows (already shuffled) so that the running cost of
the rows taken so far stays close to the window's mean times their number: any run of
consecutive rows (a microbatch, a step's batches of the lane) then costs close to the mean,
wherever the window starts relative to the steps. Rows above the mean and rows at or below it
wait in two queues in their shuffled order; each next row is the one among the first
``lookahead`` of either queue that brings the running cost closest to its target. Rows leave
each queue nearly in shuffled order, so what a step holds stays a random sample of the window
(no drift of long or short documents to either end of it). A pure function of the window's
rows, so a lane's stream stays the same on any number of ranks and after any restore.
"""

from __future__ import annotations

import numpy as np

LOOKAHEAD = 32  # rows leave their queue at most 31 places ahead of their turn


def attention_cost(positions: np.ndarray) -> np.ndarray:
    """Causal query-key pairs of each row's inputs (``positions[:, :-1]``), per document as
    TorchTitan's masks find them (a run from each position 0): int64 ``[rows]``."""
    inputs = positions[:, :-1]
    rows, length = inputs.shape
    starts = inputs == 0
    starts[:, 0] = True  # a row always begins a run
    at = np.flatnonzero(starts.ravel())
    sizes = np.diff(np.append(at, rows * length)).astype(np.int64)
    cost = np.zeros(rows, np.int64)
    np.add.at(cost, at // length, sizes * (sizes + 1) // 2)
    return cost


def balanced_order(costs: np.ndarray, lookahead: int = LOOKAHEAD) -> np.ndarray:
    """An order of the rows (``costs`` in their current order) whose running cost tracks the
    mean (see the module); exact integer arithmetic, so the same on every machine."""
    costs = [int(c) for c in costs]
    n, total = len(costs), sum(costs)
    heavy = [i for i, c in enumerate(costs) if c * n > total]
    light = [i for i, c in enumerate(costs) if c * n <= total]
    out, running = [], 0
    for k in range(1, n + 1):
        best = None  # (distance to the target, queue, place in it)
        for queue in (heavy, light):
            for j, i in enumerate(queue[:lookahead]):
                distance = abs((running + costs[i]) * n - k * total)
                if best is None or distance < best[0]:
                    best = (distance, queue, j)
        _, queue, j = best
        i = queue.pop(j)
        out.append(i)
        running += costs[i]
    return np.asarray(out, np.int64)
