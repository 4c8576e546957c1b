"""Run a job's ranks one after another in this process, and digest its global steps."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable

from zephon.batch import Batch, global_step_digest
from zephon.pipeline import Pipeline
from zephon.state import merge_states
from zephon.testing.conformance import drain

# make(dp_world_size, dp_rank) -> that rank's pipeline
MakeRank = Callable[[int, int], Pipeline]


def step_digests(batches: list[Batch] | list[tuple[int, int, str]], per_lane: int) -> dict[int, str]:
    """Global step -> digest; step ``s`` holds every lane's batches ``[s, s+1) * per_lane``.

    Takes batches, or ``(lane, index, digest)`` triples gathered from several processes.
    """
    steps: dict[int, list] = defaultdict(list)
    for b in batches:
        index = b.index if isinstance(b, Batch) else b[1]
        steps[index // per_lane].append(b)
    return {s: global_step_digest(bs) for s, bs in sorted(steps.items())}


def run_job(
    make: MakeRank, world: int, steps: int, per_lane: int, state: dict | None = None
) -> tuple[dict[int, str], dict]:
    """``steps`` global steps on ``world`` ranks (from ``state`` if given).

    Returns the digest of each global step and the merged state of all ranks at the end.
    """
    batches, states = [], []
    for rank in range(world):
        pipeline = make(world, rank)
        if state is not None:
            pipeline.load_state_dict(state)
        want = steps * per_lane * len(pipeline.owned_lanes)
        got = drain(pipeline, want)
        if len(got) != want:
            raise RuntimeError(f"rank {rank} delivered {len(got)} batches, {want} wanted: data ran out")
        batches += got
        states.append(pipeline.state_dict())
    return step_digests(batches, per_lane), merge_states(states)


def logged_losses(log: str) -> dict[int, float]:
    """Step -> loss, from TorchTitan's ``step: N  loss: X`` log lines."""
    return {int(s): float(x) for s, x in re.findall(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)", log)}
