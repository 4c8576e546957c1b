"""The determinism fuzzer: any recipe, topology, runner and resume schedule gives the global steps
of one uninterrupted run.

Hypothesis draws a recipe (lanes, a one- or two-dataset mixture, fixed or scheduled, by tokens
or records, wrap or best-fit packing, a shuffle, window rows, batches per lane per step) and a
schedule of one to three resume cycles, each on its own DP size, runner and parallelism, and
compares every global step's digest with the uninterrupted single-rank run of the same recipe.
25 examples in CI;
``ZEPHON_FUZZ_EXAMPLES=300 python -m pytest -m slow tests/test_properties.py`` runs more.
"""

from __future__ import annotations

import functools
import glob
import itertools
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon import Dataset, MixtureWorkSource, Pipeline, ScheduledMixtureWorkSource
from zephon.testing import run_job

STEPS = 6
EXAMPLES = int(os.environ.get("ZEPHON_FUZZ_EXAMPLES", "25"))


@functools.cache
def _make(corpus: str, gpt2: str, recipe: tuple, runner: str, parallelism: int):
    lanes, mixture, unit, algorithm, shuffle, window_rows, _ = recipe
    parts = sorted(glob.glob(os.path.join(corpus, "*.jsonl")))
    datasets = [Dataset.from_path("a", parts[0], exhausted="repeat")]
    if mixture:
        datasets.append(Dataset.from_path("b", parts[1], exhausted="repeat"))

    def make(world: int, rank: int) -> Pipeline:
        if mixture == "schedule":  # a step and a ramp inside the run's first steps, whatever its lanes
            per_lane = 150 if unit == "tokens" else 4
            schedule = [
                {"at": 0, "weights": {"a": 0.8, "b": 0.2}},
                {"at": per_lane * lanes, "weights": {"a": 0.2, "b": 0.8}},
                {"at": 3 * per_lane * lanes, "weights": {"a": 0.5, "b": 0.5}, "ramp": "linear"},
            ]
            source = ScheduledMixtureWorkSource(datasets, schedule, unit=unit, seed=3)
        else:
            weights = {"a": 1.0} if not mixture else {"a": mixture, "b": 1 - mixture}
            source = MixtureWorkSource(datasets, weights, unit=unit, seed=3)
        p = Pipeline(source).options(
            num_lanes=lanes, dp_rank=rank, dp_world_size=world, runner=runner, chunk_bytes=2048,
            window_rows=window_rows,
        )  # fmt: skip
        p = p.tokenize(gpt2, parallelism=parallelism).pack_flat(48, algorithm=algorithm)
        return (p.shuffle(shuffle, seed=5) if shuffle else p).batch(2)

    return make


@functools.cache
def _baseline(corpus: str, gpt2: str, recipe: tuple) -> dict:
    return run_job(_make(corpus, gpt2, recipe, "inline", 1), 1, STEPS, recipe[-1])[0]


def _divisors(n: int) -> list[int]:
    return [d for d in (1, 2, 3, 4, 6, 8) if n % d == 0]


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_recipe_topology_runner_and_resume_schedule_gives_the_uninterrupted_steps(corpus, gpt2, data):
    lanes = data.draw(st.sampled_from([1, 2, 3, 4, 6, 8]), label="num_lanes")
    recipe = (
        lanes,
        data.draw(st.sampled_from([0, 0.3, 0.5, "schedule"]), label="mixture: share of a (0: one dataset)"),
        data.draw(st.sampled_from(["tokens", "documents"]), label="mixture unit"),
        data.draw(st.sampled_from(["wrap", "wrap", "best_fit"]), label="packing"),
        data.draw(st.sampled_from([0, 3, 8]), label="shuffle buffer (0: none)"),
        data.draw(st.sampled_from([None, 2, 6, 16]), label="window_rows"),
        data.draw(st.integers(1, 3), label="batches per lane per step"),
    )
    cycles = data.draw(st.integers(1, 3), label="resume cycles")
    cuts = sorted(data.draw(st.sets(st.integers(1, STEPS - 1), min_size=cycles - 1, max_size=cycles - 1)))
    bounds = [0, *cuts, STEPS]
    digests, state = {}, None
    for a, b in itertools.pairwise(bounds):
        world = data.draw(st.sampled_from(_divisors(lanes)), label="DP size")
        runner = data.draw(st.sampled_from(["inline", "thread", "thread", "process"]), label="runner")
        parallelism = data.draw(st.integers(1, 3), label="parallelism")
        make = _make(corpus, gpt2, recipe, runner, parallelism)
        got, state = run_job(make, world, b - a, recipe[-1], state=state)
        digests.update(got)
    assert digests == _baseline(corpus, gpt2, recipe)
