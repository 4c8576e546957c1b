"""Checkpoint state: small, constant in size, merged by lanes, refused when the recipe changed."""

from __future__ import annotations

import json

import pytest

from zephon import merge_states
from zephon.testing import drain, run_job, take


def test_lane_state_stays_under_1_kib_and_does_not_grow_with_steps(make_rank):
    pipeline = make_rank(1, 0, runner="inline")
    sizes = {}
    iterator = iter(pipeline)
    for step in range(1, 2001):
        next(iterator)
        if step in (8, 80, 2000):
            lanes = pipeline.state_dict()["lanes"]
            sizes[step] = max(len(json.dumps(v)) for v in lanes.values())
    pipeline.close()
    print(f"\nlargest lane state (bytes of JSON) at steps 8, 80, 2000: {sizes}")
    assert max(sizes.values()) < 1024
    # past the first windows (whose few chunks' digests it holds: zephon.digests), it stays put
    assert sizes[2000] - sizes[80] <= 16, "a lane's state must not grow with the step count"


def test_state_is_json_and_names_the_rank_lanes(make_rank):
    pipeline = make_rank(4, 1)
    take(pipeline, 5)
    state = json.loads(json.dumps(pipeline.state_dict()))
    pipeline.close()
    assert sorted(state) == ["fingerprint", "lanes", "version"]
    assert sorted(state["lanes"], key=int) == ["2", "3"]


def test_merge_refuses_a_lane_present_twice(make_rank):
    a, b = make_rank(2, 0), make_rank(2, 0)
    with pytest.raises(ValueError, match="lane 0 is in more than one state"):
        merge_states([a.state_dict(), b.state_dict()])


def test_merge_refuses_states_of_different_recipes(make_rank):
    a, b = make_rank(2, 0), make_rank(2, 1, seed=99)
    with pytest.raises(ValueError, match="disagree on 'fingerprint'"):
        merge_states([a.state_dict(), b.state_dict()])


def test_load_refuses_a_state_that_lacks_this_ranks_lanes(make_rank):
    partial = make_rank(2, 0).state_dict()
    with pytest.raises(ValueError, match=r"lacks lanes \[4, 5, 6, 7\].*merge_states"):
        make_rank(2, 1).load_state_dict(partial)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (dict(seed=6), "operators[2].seed: 6 -> 5"),
        (dict(window_rows=4), "options.window_rows: 4 -> 8"),
        (dict(num_lanes=4), "options.num_lanes: 4 -> 8"),
    ],
)
def test_restore_under_a_changed_recipe_names_what_changed(make_rank, change, named):
    _, state = run_job(lambda d, r: make_rank(d, r, **change), 1, 1, 1)
    with pytest.raises(
        ValueError, match="different recipe.*" + named.replace("[", r"\[").replace("]", r"\]")
    ):
        make_rank(1, 0).load_state_dict(state)


def test_restore_under_another_tokenizer_names_the_tokenizer(make_rank, corpus, tmp_path):
    from zephon import Dataset, Pipeline
    from zephon.testing import gpt2_tokenizer_dir

    other = gpt2_tokenizer_dir(str(tmp_path / "tok"))
    with open(other + "/tokenizer.json") as f:
        data = json.load(f)
    data["model"]["vocab"]["zzzz_extra"] = len(data["model"]["vocab"]) + 1
    with open(other + "/tokenizer.json", "w") as f:
        json.dump(data, f)
    ds = Dataset.from_path("synthetic", corpus, exhausted="repeat")
    changed = (
        Pipeline(ds).options(num_lanes=8, chunk_bytes=2048).tokenize(other)
        .pack_flat(max_length=64).shuffle(buffer_size=8, seed=5).batch(microbatch_size=2)
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"operators\[0\].tokenizer"):
        changed.load_state_dict(make_rank(1, 0).state_dict())


def test_performance_settings_may_change_between_save_and_restore(make_rank):
    pipeline = make_rank(2, 0, runner="inline", parallelism=1, prefetch=1)
    take(pipeline, 7)
    state = pipeline.state_dict()
    pipeline.close()
    other = make_rank(4, 0, runner="thread", parallelism=4, prefetch=8)
    other.load_state_dict(state)
    assert other.state_dict()["lanes"] == {k: state["lanes"][k] for k in ("0", "1")}


def test_iterating_again_continues_where_delivery_stopped(make_rank):
    reference = drain(make_rank(1, 0), 30)
    pipeline = make_rank(1, 0)
    first = take(pipeline, 11)  # the run reads ahead; only the 11 delivered batches count
    rest = drain(pipeline, 19)
    assert [b.digest() for b in first + rest] == [b.digest() for b in reference]


def test_unsupported_state_version_is_refused(make_rank):
    state = make_rank(1, 0).state_dict()
    state["version"] = 99
    with pytest.raises(ValueError, match="version 99 is not supported"):
        make_rank(1, 0).load_state_dict(state)


def test_an_iterator_superseded_by_a_new_one_raises_instead_of_hanging_or_ending(make_rank):
    pipeline = make_rank(1, 0)
    old = iter(pipeline)
    next(old)
    new = iter(pipeline)  # a new run from the delivered state closes the old one
    with pytest.raises(RuntimeError, match="iterate that one instead"):
        next(old)
    assert next(new).index == 0 and next(new).lane == 2  # lane 0 gave batch 0 before; now lanes 1, 2...
    pipeline.close()


def test_a_state_of_the_chunk_mixing_zephon_is_refused_with_what_to_do(make_rank):
    state = make_rank(1, 0).state_dict()
    state["version"] = 1
    with pytest.raises(ValueError, match=r"version 1.*start a new run"):
        make_rank(1, 0).load_state_dict(state)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("delivered", 4, "says 4 batches of window 0 were delivered, but that window holds 1"),
        ("delivered", -1, "malformed lane state"),
        ("mixer", {"positions": [[0, 0]], "used": [0]}, "malformed mixer state"),
        ("mixer", {"positions": [[0, 0, 0], [0, 0, 0]], "used": [0, 0]}, "does not match 1 datasets"),
    ],
)
def test_an_impossible_lane_state_is_refused(make_rank, field, value, message):
    state = make_rank(1, 0).state_dict()
    state["lanes"]["0"][field] = value
    state["lanes"]["0"]["index"] = 4
    with pytest.raises(ValueError, match=message):
        pipeline = make_rank(1, 0)
        pipeline.load_state_dict(state)
        drain(pipeline, 40)  # lane 0 comes after the others have caught up to index 4


def _set(path: str, value: int):
    """A change to lane 0's state: ``path`` is a key, or ``position.i`` (of dataset 0's position)."""

    def change(lane: dict) -> None:
        if path.startswith("position."):
            lane["mixer"]["positions"][0][int(path[-1])] = value
        elif path == "used":
            lane["mixer"]["used"][0] = value
        else:
            lane[path] = value

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            _set("index", 10**15),
            r"lane 0: the state's index 1000000000000000 does not follow from its window \d+ ",
        ),
        (
            _set("position.0", 10**6),
            r"lane 0: dataset 'synthetic': .*\[1000000, .* is further than the \d+ documents",
        ),
        (
            _set("position.1", 10**6),
            r"lane 0: dataset 'synthetic': .*names record 1000000, which is not a document",
        ),
        (
            _set("position.2", 10**6),
            r"lane 0: dataset 'synthetic': .* is 1000000 tokens into a document of \d+ tokens",
        ),
        (_set("used", 10**12), r"lane 0: dataset 'synthetic': the state's mixer has used 1000000000000 "),
    ],
)
def test_a_mid_run_lane_state_no_run_could_reach_is_refused_naming_the_lane_and_field(
    make_rank, change, message
):
    pipeline = make_rank(1, 0)
    take(pipeline, 32)  # 4 batches of every lane: lane 0 is next
    state = pipeline.state_dict()
    pipeline.close()
    assert state["lanes"]["0"]["window"] > 0, "lane 0 stands past its first window"
    change(state["lanes"]["0"])
    with pytest.raises(ValueError, match=message):
        resumed = make_rank(1, 0)
        resumed.load_state_dict(state)
        next(iter(resumed))  # lane 0 comes first


def test_a_position_past_the_end_of_a_dataset_that_stops_is_refused(corpus, gpt2):
    from zephon import Dataset, Pipeline

    def make():
        ds = Dataset.from_path("d", corpus, exhausted="stop")
        return Pipeline(ds).options(num_lanes=8, chunk_bytes=2048).tokenize(gpt2).pack_flat(64).batch(2)

    pipeline = make()
    take(pipeline, 32)
    state = pipeline.state_dict()
    pipeline.close()
    state["lanes"]["0"]["mixer"]["positions"][0][0] = 1000
    with pytest.raises(ValueError, match=r"lane 0: dataset 'd': .*\[1000, .* is past the end of the dataset"):
        resumed = make()
        resumed.load_state_dict(state)
        next(iter(resumed))


def test_a_performance_setting_changed_after_load_state_dict_keeps_the_state(make_rank):
    reference = drain(make_rank(1, 0), 30)
    first = make_rank(1, 0)
    take(first, 11)
    state = first.state_dict()
    first.close()
    restored = make_rank(1, 0)
    restored.load_state_dict(state)
    restored = restored.options(prefetch=8, runner="inline")  # was: silently back to batch 0
    assert [b.digest() for b in drain(restored, 19)] == [b.digest() for b in reference[11:]]


def test_a_recipe_change_on_a_pipeline_that_holds_state_is_refused(make_rank, corpus, gpt2):
    from zephon import Dataset, Pipeline

    pipeline = make_rank(1, 0)
    take(pipeline, 3)
    with pytest.raises(ValueError, match=r"holds state.*options \['num_lanes'\].*build the pipeline in full"):
        pipeline.options(num_lanes=4)
    pipeline.close()
    unbatched = Pipeline(Dataset.from_path("d", corpus)).tokenize(gpt2).pack_flat(8)
    unbatched.load_state_dict(unbatched.state_dict())
    with pytest.raises(ValueError, match=r"holds state.*the operators"):
        unbatched.batch(2)


def test_start_makes_a_separate_run_of_the_same_recipe(make_rank):
    pipeline = make_rank(1, 0)
    take(pipeline, 5)
    other = pipeline.start()
    assert [b.index for b in take(other, 8)] == [0] * 8, "a new run starts at the start"
    resumed = pipeline.start(pipeline.state_dict())
    assert next(iter(resumed)).lane == 5, "lanes 0-4 delivered their batch 0; lane 5 is next"
    for run in (pipeline, other, resumed):
        run.close()


def test_the_table_of_what_may_change_covers_every_option_and_holds(make_rank):
    import dataclasses

    from zephon.fingerprint import MAY_CHANGE, PERFORMANCE_OPTIONS, SHAPING_OPTIONS
    from zephon.options import Options

    names = {f.name for f in dataclasses.fields(Options)}
    assert names == set(SHAPING_OPTIONS) | set(PERFORMANCE_OPTIONS) | {"dp_rank", "dp_world_size"}
    assert set(PERFORMANCE_OPTIONS) < set(MAY_CHANGE)
    base = make_rank(1, 0).fingerprint()
    changed = dict(
        runner="process", prefetch=3, read_parallelism=3, worker_timeout=5.0,
        io_options={"retries": {"attempts": 2}}, parallelism=3,
    )  # fmt: skip
    for name, value in changed.items():
        assert make_rank(1, 0, **{name: value}).fingerprint() == base, f"{name} may change"
    assert make_rank(2, 1).fingerprint() == base, "dp_rank, dp_world_size may change"
    for name, value in dict(num_lanes=4, chunk_size=64, chunk_bytes=4096, window_rows=16).items():
        assert make_rank(1, 0, **{name: value}).fingerprint() != base, f"{name} shapes the data"
