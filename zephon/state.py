"""Checkpoint state: what each lane has delivered, and the recipe it was made with.

Shape (JSON-safe)::

    {"version": 3,                         # 2: before chunk digests were XXH3 (read as well)
     "fingerprint": {...},                 # everything that shapes the data; must match
     "lanes": {"0": LANE, "1": LANE, ...}} # the lanes of the ranks whose states were merged

    LANE = {"window": w,            # window now being delivered
            "delivered": n,         # batches of that window already delivered
            "index": i,             # index of the next batch of the lane
            "mixer": {"positions": [[chunk, record, offset], ...],  # read position per dataset
                      "used": [...]},                            # units taken per dataset
                                    # (both at the start of window w)
            "tokens": [...],        # tokens delivered so far, per dataset
            "documents": [...],     # documents begun so far, per dataset
            "counters": {...},      # e.g. empty_documents, filtered_records, so far
            "digests": [[dataset, chunk, "xxh3:16 hex digits"], ...]}  # of the chunks replay reads again

A lane's state is a few integers per dataset whatever the step, and the digests of the handful of
chunks its window reads (zephon.digests; states saved before those were XXH3 hold 16 hex digits of
SHA-256, which a restore checks as such). Restore replays window ``w`` from its first token and
drops the ``n`` batches already delivered, checking that those chunks hold the same bytes.

What may change between save and restore is the table ``MAY_CHANGE`` of zephon.fingerprint
(runner, parallelism, prefetch, dp_rank and dp_world_size, any that divides num_lanes, ...);
anything in the fingerprint may not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from zephon.work import MixState

VERSION = 3
READS = (2, 3)  # version 2's digests are SHA-256 (untagged), checked as such on restore


@dataclass(slots=True)
class LaneState:
    window: int
    delivered: int
    index: int
    mix: MixState
    tokens: list[int]
    documents: list[int]
    counters: dict[str, int] = field(default_factory=dict)
    digests: tuple[tuple[int, int, str], ...] = ()  # (dataset, chunk number, digest) to replay

    @staticmethod
    def start(num_datasets: int) -> LaneState:
        return LaneState(0, 0, 0, MixState.start(num_datasets), [0] * num_datasets, [0] * num_datasets, {})

    def to_json(self) -> dict:
        return {
            "window": self.window,
            "delivered": self.delivered,
            "index": self.index,
            "mixer": self.mix.to_json(),
            "tokens": list(self.tokens),
            "documents": list(self.documents),
            "counters": dict(self.counters),
            "digests": [list(entry) for entry in self.digests],
        }

    @staticmethod
    def from_json(data: dict, num_datasets: int, lane: int | str = "?") -> LaneState:
        """A lane's state from its JSON, refused with the lane and the field where malformed."""
        where = f"lane {lane}: malformed lane state"
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a table of fields, got {data!r}")

        def field(name: str, parse, default=None):
            if name not in data and default is None:
                raise ValueError(f"{where}: it has no field {name!r}")
            value = data.get(name, default)
            try:
                return parse(value)
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{where}: field {name!r} = {value!r}: {e}") from None

        def counts(value) -> list[int]:
            out = [int(x) for x in value]
            if len(out) != num_datasets or min(out, default=0) < 0:
                raise ValueError(f"expected {num_datasets} counts >= 0, one per dataset")
            return out

        def whole(value) -> int:
            if int(value) < 0:
                raise ValueError("expected a whole number >= 0")
            return int(value)

        state = LaneState(
            field("window", whole), field("delivered", whole), field("index", whole),
            field("mixer", lambda v: MixState.from_json(v, num_datasets)), field("tokens", counts),
            field("documents", counts), field("counters", _counters, {}),
            field("digests", lambda v: _digests(v, num_datasets), []),
        )  # fmt: skip
        if state.delivered > state.index or state.window > state.index:
            raise ValueError(
                f"{where}: window = {state.window} and delivered = {state.delivered} cannot exceed index = "
                f"{state.index} (a window holds at least one batch)"
            )
        return state


def _counters(value: dict) -> dict[str, int]:
    return {str(k): int(n) for k, n in value.items()}


def _digests(entries: list, num_datasets: int) -> tuple[tuple[int, int, str], ...]:
    out = []
    for entry in entries:
        dataset, chunk, digest = entry
        if not (
            0 <= int(dataset) < num_datasets
            and int(chunk) >= 0
            and re.fullmatch(r"(xxh3:)?[0-9a-f]{16}", digest)
        ):
            raise ValueError(f"digests entry {entry!r} is not [dataset, chunk, 'xxh3:' and 16 hex digits]")
        out.append((int(dataset), int(chunk), digest))
    return tuple(out)


def merge_states(states: list[dict], same_step: bool = True) -> dict:
    """The state of a whole job from its ranks' states: the union of their lanes.

    Everything but ``lanes`` must agree; a lane found in two states is an error, and so are
    states saved at different steps: round-robin delivery keeps the lanes of a run within one
    batch of each other, so states whose furthest lanes are further apart than that were not
    saved together (a rank whose lanes all ended early is the exception: merge it with
    ``same_step=False``).
    """
    if not states:
        raise ValueError("merge_states needs at least one state")
    merged = {k: v for k, v in states[0].items() if k != "lanes"}
    lanes: dict = {}
    for i, state in enumerate(states):
        check_version(state)
        for key in set(state) | set(merged):
            if key != "lanes" and state.get(key) != merged.get(key):
                raise ValueError(f"states 0 and {i} disagree on {key!r}; were they saved by one job?")
        for lane, value in state["lanes"].items():
            if lane in lanes:
                raise ValueError(f"lane {lane} is in more than one state: merge each rank's state once")
            lanes[lane] = value
    merged["lanes"] = dict(sorted(lanes.items(), key=lambda kv: int(kv[0])))
    furthest = [max((lane.get("index", 0) for lane in s["lanes"].values()), default=0) for s in states]
    if same_step and max(furthest) - min(furthest) > 1:
        low, high = furthest.index(min(furthest)), furthest.index(max(furthest))
        raise ValueError(
            f"state {low}'s lanes have delivered {furthest[low]} batches, state {high}'s "
            f"{furthest[high]}: the states were saved at different steps; merge the states of "
            "one checkpoint (or pass same_step=False for ranks whose lanes all ended early)"
        )
    return merged


def check_version(state: dict) -> None:
    if not isinstance(state, dict) or "version" not in state or "lanes" not in state:
        raise ValueError("not a zephon pipeline state: expected keys 'version' and 'lanes'")
    if state["version"] == 1:
        raise ValueError(
            "this pipeline state has version 1, written by zephon before lanes mixed documents and "
            "windows ended on whole microbatches; the data order changed with it, so the run cannot "
            "continue on this zephon: finish it with the zephon that wrote it, or start a new run"
        )
    if state["version"] not in READS:
        raise ValueError(
            f"pipeline state version {state['version']} is not supported; this zephon reads versions "
            f"{', '.join(map(str, READS))}"
        )
