"""Every operator under every runner: restore at every step gives the uninterrupted tail."""

from __future__ import annotations

import pytest
from support.functions import keeps_most, long_enough, shout

from zephon import Dataset, Pipeline
from zephon.testing import check_conformance, drain, write_jsonl

RECIPES = {  # windows of a few batches, so that 16 steps cross several of them
    "map-filter-wrap": lambda p, t: p.map(shout).filter(long_enough).tokenize(t).pack_flat(48).batch(2),
    "best_fit": lambda p, t: (
        p.options(window_rows=6).tokenize(t).pack_flat(48, algorithm="best_fit").batch(3)
    ),
    "shuffle": lambda p, t: p.tokenize(t).pack_flat(32).shuffle(7, seed=2).batch(2),
}


def _make(corpus, gpt2, recipe, runner):
    def make():
        ds = Dataset.from_path("synthetic", corpus, exhausted="repeat")
        p = Pipeline(ds).options(num_lanes=3, chunk_bytes=3000, runner=runner)
        return RECIPES[recipe](p, gpt2)

    return make


@pytest.mark.parametrize("runner", ["inline", "thread", "process"])
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_operator_conforms_restore_at_every_step(corpus, gpt2, recipe, runner):
    every = 4 if runner == "process" else 1  # a process pool per restore is slow to start
    check_conformance(_make(corpus, gpt2, recipe, runner), steps=16, tail=4, every=every)


def test_filter_and_empty_documents_are_counted_not_errors(tmp_path, gpt2):
    records = [{"text": "one two three four five six"}, {"text": ""}, {"text": "short"}] * 20
    write_jsonl(str(tmp_path / "d.jsonl"), records)
    ds = Dataset.from_path("d", str(tmp_path / "d.jsonl"))
    pipeline = Pipeline(ds).filter(lambda r: r["text"] != "short").tokenize(gpt2)
    pipeline = pipeline.pack_flat(16).batch(2)
    drain(pipeline, 1000)
    assert pipeline.stats()["counters"] == {"empty_documents": 20, "filtered_records": 20}


def test_map_must_return_a_record(corpus, gpt2):
    ds = Dataset.from_path("synthetic", corpus)
    pipeline = Pipeline(ds).map(lambda r: r["text"]).tokenize(gpt2).pack_flat(16).batch(1)
    with pytest.raises(ValueError, match="returned str, expected a dict record"):
        drain(pipeline, 1)


def test_tokenize_names_a_missing_field_and_the_dataset(corpus, gpt2):
    ds = Dataset.from_path("synthetic", corpus)
    pipeline = Pipeline(ds).tokenize(gpt2, field="body").pack_flat(16).batch(1)
    with pytest.raises(
        ValueError, match=r"dataset 'synthetic'.*no such field; its fields are \['id', 'text'\]"
    ):
        drain(pipeline, 1)


def test_tokenize_refuses_a_non_string_text(tmp_path, gpt2):
    write_jsonl(str(tmp_path / "d.jsonl"), [{"text": None}])
    pipeline = Pipeline(Dataset.from_path("d", str(tmp_path / "d.jsonl")))
    pipeline = pipeline.tokenize(gpt2).pack_flat(16).batch(1)
    with pytest.raises(ValueError, match="expected a string, got NoneType"):
        drain(pipeline, 1)


def test_process_runner_explains_an_unpicklable_function(corpus, gpt2):
    ds = Dataset.from_path("synthetic", corpus)
    pipeline = Pipeline(ds).options(runner="process").map(lambda r: r).tokenize(gpt2)
    with pytest.raises(ValueError, match=r"cannot be pickled.*module level"):
        drain(pipeline.pack_flat(16).batch(1), 1)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda p, t: p.pack_flat(16), "pack_flat takes docs, but the pipeline gives records"),
        (lambda p, t: p.tokenize(t).batch(2), "batch takes rows, but the pipeline gives docs"),
        (lambda p, t: p.tokenize(t).pack_flat(8).batch(1).map(len), "batch must be the last"),
        (lambda p, t: p.tokenize(t).pack_flat(0), r"max_length=0\): must be an int >= 1"),
        (lambda p, t: p.tokenize(t).pack_flat(8, "first_fit"), "algorithm='first_fit'"),
        (lambda p, t: p.tokenize("/no/such/tokenizer.json"), "tokenizer '/no/such/tokenizer.json' not found"),
        (
            lambda p, t: p.options(num_lanes=6, dp_world_size=4),
            "num_lanes=6 is not divisible by dp_world_size=4",
        ),
        (lambda p, t: p.options(runner="gpu"), "runner='gpu'"),
        (lambda p, t: p.options(lanes=4), r"options: unknown key 'lanes'; valid keys: \['chunk_bytes'"),
        (lambda p, t: p.options(num_lanes="8"), r"options: num_lanes = '8' should be an int"),
        (
            lambda p, t: p.options(flush_every=4),
            r"options: unknown key .flush_every.; valid keys: .*window_rows",
        ),
        (
            lambda p, t: p.tokenize(t).shuffle(8),
            "shuffle takes rows, but the pipeline gives docs.*shuffle the packed rows",
        ),
        (
            lambda p, t: p.options(window_rows=5).tokenize(t).pack_flat(8).batch(2).fingerprint(),
            "window_rows=5 is not a whole number of microbatches of 2 rows",
        ),
    ],
)
def test_bad_pipelines_are_explained(corpus, gpt2, build, message):
    with pytest.raises(ValueError, match=message):
        build(Pipeline(Dataset.from_path("synthetic", corpus)), gpt2)


def test_iterating_without_batch_is_explained(corpus, gpt2):
    pipeline = Pipeline(Dataset.from_path("synthetic", corpus)).tokenize(gpt2).pack_flat(8)
    with pytest.raises(ValueError, match=r"end the pipeline with .batch"):
        iter(pipeline)


def test_a_map_error_keeps_its_type_and_says_where(tmp_path, gpt2):
    import json

    write_jsonl(str(tmp_path / "d.jsonl"), [{"text": "{not json"}])
    pipeline = Pipeline(Dataset.from_path("d", str(tmp_path / "d.jsonl")))
    pipeline = pipeline.map(lambda r: json.loads(r["text"])).tokenize(gpt2).pack_flat(8).batch(1)
    with pytest.raises(json.JSONDecodeError) as error:
        drain(pipeline, 1)
    assert "dataset 'd'" in " ".join(getattr(error.value, "__notes__", []))


def test_a_filter_built_with_another_threshold_is_another_recipe():
    from zephon.ops.records import function_fingerprint

    def longer_than(n):
        return lambda r: len(r["text"]) > n

    assert function_fingerprint(longer_than(5)) != function_fingerprint(longer_than(500))
    assert function_fingerprint(longer_than(5)) == function_fingerprint(longer_than(5))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cache": True}, r"io_options\['cache'\] must be a table"),
        ({"cache": {"max_bytes": "1G"}}, r"io_options\['cache'\]: max_bytes = '1G' should be an int"),
        ({"retries": {"attemps": 3}}, r"unknown key 'attemps'; valid keys: \['attempts'"),
        ({"cash": {}}, r"io_options: unknown key 'cash'"),
        ({"retries": {"budget": -1}}, r"\['budget'\] must not be negative"),
    ],
)
def test_bad_io_options_are_explained(corpus, options, message):
    with pytest.raises(ValueError, match=message):
        Pipeline(Dataset.from_path("d", corpus)).options(io_options=options)


def test_negative_seeds_are_refused_when_the_pipeline_is_built(corpus, gpt2):
    from zephon import DatasetWorkSource

    with pytest.raises(ValueError, match=r"shuffle\(seed=-1\): must be an int >= 0"):
        Pipeline(Dataset.from_path("d", corpus)).tokenize(gpt2).pack_flat(8).shuffle(4, seed=-1)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        DatasetWorkSource(Dataset.from_path("d", corpus), seed=-3)


def _data_stats(pipeline) -> dict:
    """A run's stats but its store requests ("io"), which depend on how far workers read ahead."""
    return {k: v for k, v in pipeline.stats().items() if k != "io"}


@pytest.mark.parametrize("runner", ["inline", "process"])
def test_counters_and_documents_carry_across_a_restore_inside_a_chunk(tmp_path, gpt2, runner):
    records = [{"text": f"document number {i} " * (i % 7)} for i in range(600)]  # every 7th empty
    write_jsonl(str(tmp_path / "d.jsonl"), records)

    def make():
        ds = Dataset.from_path("d", str(tmp_path / "d.jsonl"), exhausted="repeat")
        p = Pipeline(ds).options(num_lanes=2, chunk_bytes=8 << 10, runner=runner)
        return p.filter(keeps_most).tokenize(gpt2).pack_flat(16).shuffle(4, seed=1).batch(2)

    whole = make()
    drain(whole, 90)
    first = make()
    drain(first, 37)
    state = first.state_dict()
    assert any(lane["mixer"]["positions"][0][1] > 0 for lane in state["lanes"].values()), "inside a chunk"
    rest = make()
    rest.load_state_dict(state)
    drain(rest, 53)
    assert _data_stats(rest) == _data_stats(whole)
    assert (
        whole.stats()["counters"]["empty_documents"] > 0 and whole.stats()["counters"]["filtered_records"] > 0
    )
