"""The conformance check every operator's tests use: restore at every step.

For a pipeline factory, it takes ``steps`` batches; at every step it checks that the state's
structure never changes, that ``load_state_dict(state_dict())`` round-trips, and that a fresh
pipeline restored from the state yields exactly the original tail.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable

from zephon.batch import Batch
from zephon.pipeline import Pipeline


def take(pipeline: Iterable[Batch], n: int) -> list[Batch]:
    """The next ``n`` batches (fewer if the pipeline ends); the run is left open."""
    return list(itertools.islice(iter(pipeline), n))


def drain(pipeline: Pipeline, n: int) -> list[Batch]:
    """Up to ``n`` batches from a fresh run, then the run is closed."""
    try:
        return take(pipeline, n)
    finally:
        pipeline.close()


def _structure(value):
    """Keys and types; counters and list lengths may change (a mixing lane's recent chunks)."""
    if isinstance(value, dict):
        return {k: _structure(v) for k, v in value.items() if k != "counters"}
    if isinstance(value, list):
        return "list"
    return type(value).__name__


def check_conformance(make: Callable[[], Pipeline], steps: int, tail: int = 4, every: int = 1) -> list[Batch]:
    """Returns the uninterrupted run's batches; raises AssertionError on any violation."""
    reference = make()
    batches = drain(reference, steps + tail)
    assert batches, "the pipeline yielded nothing"
    pipeline = make()
    iterator = iter(pipeline)
    first = pipeline.state_dict()
    shape = _structure(first)
    for step in range(min(steps, len(batches))):
        if step % every == 0:
            state = pipeline.state_dict()
            assert _structure(state) == shape, f"state structure changed at step {step}"
            assert json.loads(json.dumps(state)) == state, "state is not JSON-safe"
            restored = make()
            restored.load_state_dict(state)
            assert restored.state_dict() == state, f"state does not round-trip at step {step}"
            got = drain(restored, tail)
            want = batches[step : step + tail]
            assert [b.digest() for b in got] == [b.digest() for b in want], (
                f"restored tail differs at step {step}"
            )
        next(iterator)
    pipeline.close()
    return batches
