"""The job plan: made once, saved, loaded, given to a pipeline that then lists nothing and reads
no metadata, and refused by name when it belongs to another recipe."""

from __future__ import annotations

import io
import os

import boto3
import pytest

from zephon import Dataset, MixtureWorkSource, Pipeline
from zephon.io import dataset as dataset_module
from zephon.jobplan import JobPlan
from zephon.testing import synthetic_documents, take, write_jsonl, write_parquet


def _pipeline(datasets, gpt2, **options) -> Pipeline:
    source = MixtureWorkSource(datasets, {d.name: 1.0 for d in datasets}, unit="tokens", seed=3)
    options = {"num_lanes": 4, **options}
    return Pipeline(source).options(**options).tokenize(gpt2).pack_flat(64).shuffle(8, seed=1).batch(2)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A JSON lines folder and a Parquet folder (3 files each, several row groups)."""
    root = tmp_path_factory.mktemp("planned")
    docs = synthetic_documents(600, seed=11)
    for i in range(3):
        os.makedirs(root / "j", exist_ok=True)
        os.makedirs(root / "p", exist_ok=True)
        write_jsonl(str(root / "j" / f"part-{i}.jsonl"), docs[i * 200 : (i + 1) * 200])
        write_parquet(str(root / "p" / f"part-{i}.parquet"), docs[i * 200 : (i + 1) * 200], row_group_size=50)
    return root


def _datasets(root):
    return [Dataset.from_path("j", str(root / "j")), Dataset.from_path("p", str(root / "p"))]


def test_a_saved_plan_gives_the_same_batches_and_the_run_lists_nothing(local, gpt2, tmp_path, monkeypatch):
    reference = [b.digest() for b in take(_pipeline(_datasets(local), gpt2), 40)]
    plan = _pipeline(_datasets(local), gpt2).plan()
    plan.save(str(tmp_path / "job.zplan"))
    loaded = JobPlan.load(str(tmp_path / "job.zplan"))

    def refuse(*args, **kwargs):
        raise AssertionError("a pipeline with a plan lists nothing and reads no planning metadata")

    monkeypatch.setattr(dataset_module, "_find", refuse)  # every listing goes through it
    monkeypatch.setattr(dataset_module, "_local_version", refuse)
    pipeline = _pipeline(_datasets(local), gpt2).with_plan(loaded)
    assert [b.digest() for b in take(pipeline, 40)] == reference
    state = pipeline.state_dict()  # the fingerprint's file versions come from the plan too
    resumed = _pipeline(_datasets(local), gpt2).with_plan(loaded)
    resumed.load_state_dict(state)
    next(iter(resumed))
    for p in (pipeline, resumed):
        p.close()


def test_a_plan_keeps_every_file_and_chunk_through_bytes(local, gpt2):
    plan = _pipeline(_datasets(local), gpt2).plan()
    again = JobPlan.from_bytes(plan.to_bytes())
    assert again.recipe == plan.recipe and again.summary() == plan.summary()
    for a, b in zip(plan.datasets, again.datasets, strict=True):
        assert list(a.files) == list(b.files) and a.fields == b.fields and a.format == b.format
        assert (a.chunks.ranges() == b.chunks.ranges()).all()
    assert plan.files == 6 and plan.chunks == sum(len(d.chunks) for d in plan.datasets) > 12


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_lanes": 8}, r"num_lanes: 4 -> 8"),
        ({"chunk_bytes": 999}, r"chunk_bytes: None -> 999"),
        ("path", r"datasets\[1\]\.path: '.*/p' -> '.*/j'"),
    ],
)
def test_a_plan_made_for_another_recipe_is_refused_by_name(local, gpt2, change, message):
    plan = _pipeline(_datasets(local), gpt2).plan()
    if change == "path":
        datasets = [Dataset.from_path("j", str(local / "j")), Dataset.from_path("p", str(local / "j"))]
        pipeline = _pipeline(datasets, gpt2)
    else:
        pipeline = _pipeline(_datasets(local), gpt2, **change)
    with pytest.raises(ValueError, match=rf"job plan was made for another recipe; differs: .*{message}"):
        next(iter(pipeline.with_plan(plan)))


def test_what_is_not_a_plan_is_named(tmp_path):
    path = tmp_path / "x.zplan"
    path.write_bytes(b"not a plan")
    with pytest.raises(ValueError, match=r"x\.zplan is not a zephon job plan"):
        JobPlan.load(str(path))
    with pytest.raises(ValueError, match=r"with_plan takes a JobPlan"):
        Pipeline(Dataset.from_path("d", str(tmp_path))).with_plan({"a": 1})


def test_an_s3_run_with_a_plan_sends_the_store_no_listing_nor_planning_read(s3, gpt2):
    server, storage = s3
    client = boto3.client(
        "s3", endpoint_url=storage["client_kwargs"]["endpoint_url"], region_name="us-east-1"
    )
    docs = synthetic_documents(400, seed=5)
    for i in range(4):
        buffer = io.BytesIO()
        write_parquet(buffer, docs[i * 100 : (i + 1) * 100], row_group_size=25)
        client.put_object(Bucket="corpus", Key=f"planned/part-{i}.parquet", Body=buffer.getvalue())

    def datasets():
        return [Dataset.from_path("s", "s3://corpus/planned/", storage_options=storage)]

    server.reset()
    plan = _pipeline(datasets(), gpt2).plan()
    planning = list(server.log)
    server.reset()
    pipeline = _pipeline(datasets(), gpt2).with_plan(JobPlan.from_bytes(plan.to_bytes()))
    take(pipeline, 20)
    pipeline.close()
    run = list(server.log)
    assert any(method == "GET" and rng is None for method, _, rng, _, _ in planning), "planning lists"
    assert [r for r in run if r[0] != "GET" or r[2] is None] == [], "with a plan: range reads only"


def test_a_plan_whose_metadata_three_processes_read_is_the_plan_one_makes_alone(local, gpt2):
    from zephon.jobplan import from_groups, groups, listing

    alone = _pipeline(_datasets(local), gpt2).plan()
    spec = _pipeline(_datasets(local), gpt2).spec()
    listed = JobPlan.from_bytes(listing(spec.source.datasets, 4, None, None, spec.options.io).to_bytes())
    parts = []
    for share in range(3):  # each as another process would: its own datasets, the shared listing
        datasets = _pipeline(_datasets(local), gpt2).spec().source.datasets
        parts.append(groups(listed, datasets, share, 3, spec.options.io))
    assert all(len(part[1]) == 1 for part in parts), "each process read one Parquet file's footer"
    made = from_groups(listed, _pipeline(_datasets(local), gpt2).spec().source.datasets, parts)
    for a, b in zip(alone.datasets, made.datasets, strict=True):
        assert list(a.files) == list(b.files) and (a.chunks.ranges() == b.chunks.ranges()).all()
    assert made.recipe == alone.recipe
