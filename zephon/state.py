"""Checkpoint state: what each lane has delivered, and the recipe it was made with.

Shape (JSON-safe)::

    {"version": 1,
     "fingerprint": {...},                 # everything that shapes the data; must match
     "rates": {"wiki": 0.26, ...},         # measured units per chunk unit, reused on restore
                                           # (None before the first run has measured them)
     "lanes": {"0": LANE, "1": LANE, ...}} # the lanes of the ranks whose states were merged

    LANE = {"window": w,            # flush window now being delivered
            "delivered": n,         # batches of that window already delivered
            "index": i,             # index of the next batch of the lane
            "cursor": {"taken": [...], "used": [...]},  # work source at the window's start
            "tokens": [...],        # tokens delivered so far, per dataset
            "counters": {...}}      # e.g. empty_documents, filtered_records, so far

A lane's state is a few integers whatever the step. Restore replays window ``w`` from its first
chunk and drops the ``n`` batches already delivered.

What may change between save and restore: runner, parallelism, prefetch, dp_rank and
dp_world_size (any that divides num_lanes). Anything in the fingerprint may not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zephon.work import Cursor

VERSION = 1


@dataclass(slots=True)
class LaneState:
    window: int
    delivered: int
    index: int
    cursor: Cursor
    tokens: list[int]
    counters: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def start(cursor: Cursor, num_datasets: int) -> LaneState:
        return LaneState(0, 0, 0, cursor, [0] * num_datasets, {})

    def to_json(self) -> dict:
        return {
            "window": self.window,
            "delivered": self.delivered,
            "index": self.index,
            "cursor": self.cursor.to_json(),
            "tokens": list(self.tokens),
            "counters": dict(self.counters),
        }

    @staticmethod
    def from_json(data: dict, num_datasets: int) -> LaneState:
        try:
            state = LaneState(
                int(data["window"]),
                int(data["delivered"]),
                int(data["index"]),
                Cursor.from_json(data["cursor"], num_datasets),
                [int(t) for t in data["tokens"]],
                {str(k): int(v) for k, v in data.get("counters", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed lane state {data!r}: {e}") from None
        if len(state.tokens) != num_datasets or min(state.window, state.delivered, state.index) < 0:
            raise ValueError(f"malformed lane state {data!r}")
        return state


def merge_states(states: list[dict]) -> dict:
    """The state of a whole job from its ranks' states: the union of their lanes.

    Everything but ``lanes`` must agree; a lane found in two states is an error.
    """
    if not states:
        raise ValueError("merge_states needs at least one state")
    merged = {k: v for k, v in states[0].items() if k != "lanes"}
    lanes: dict = {}
    for i, state in enumerate(states):
        check_version(state)
        if merged.get("rates") is None:  # a rank that had not run yet has not measured them
            merged["rates"] = state.get("rates")
        for key in set(state) | set(merged):
            if key == "lanes" or (key == "rates" and state.get(key) is None):
                continue
            if state.get(key) != merged.get(key):
                raise ValueError(f"states 0 and {i} disagree on {key!r}; were they saved by one job?")
        for lane, value in state["lanes"].items():
            if lane in lanes:
                raise ValueError(f"lane {lane} is in more than one state: merge each rank's state once")
            lanes[lane] = value
    merged["lanes"] = dict(sorted(lanes.items(), key=lambda kv: int(kv[0])))
    return merged


def check_version(state: dict) -> None:
    if not isinstance(state, dict) or "version" not in state or "lanes" not in state:
        raise ValueError("not a zephon pipeline state: expected keys 'version' and 'lanes'")
    if state["version"] != VERSION:
        raise ValueError(
            f"pipeline state version {state['version']} is not supported; this zephon reads version {VERSION}"
        )


def diff(saved, current, path: str = "") -> list[str]:
    """Readable differences between two fingerprints: ``path: saved -> current``."""
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current), key=str):
            sub = f"{path}.{key}" if path else str(key)
            out += diff(saved.get(key, "<absent>"), current.get(key, "<absent>"), sub)
        return out
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        return [
            d for i, (a, b) in enumerate(zip(saved, current, strict=True)) for d in diff(a, b, f"{path}[{i}]")
        ]
    return [] if saved == current else [f"{path}: {saved!r} -> {current!r}"]
