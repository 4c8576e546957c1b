"""The bytes are the run's: a chunk read again with other bytes fails by name (zephon.digests)."""

from __future__ import annotations

import pytest
from support.damage import edit_a_replayed_chunk, edit_in_place, numbered_pipeline, write_numbered_lines

from zephon import Dataset
from zephon.io.remote import ChangedFileError
from zephon.testing import take


@pytest.mark.parametrize("runner", ["thread", "process"])
def test_a_local_file_edited_in_place_with_size_and_mtime_kept_fails_the_restore_by_name(
    tmp_path, gpt2, runner
):
    path = tmp_path / "d.jsonl"
    lines = write_numbered_lines(str(path))
    assert 800_000 < len(lines) < 1_100_000
    pipeline = numbered_pipeline(str(path), gpt2, runner)
    take(pipeline, 21)
    state = pipeline.state_dict()
    pipeline.close()
    edit_a_replayed_chunk(str(path), numbered_pipeline(str(path), gpt2), state)

    resumed = numbered_pipeline(str(path), gpt2, runner)
    resumed.load_state_dict(state)  # the file's listed version (size, sampled bytes) is unchanged
    with pytest.raises(
        ChangedFileError, match=r"d\.jsonl, bytes \[\d+, \d+\) changed during the run: the run "
    ):
        take(resumed, 40)
    resumed.close()


@pytest.mark.parametrize("runner", ["inline", "process"])
def test_a_chunk_read_again_in_a_later_epoch_with_other_bytes_fails_naming_the_file(tmp_path, gpt2, runner):
    path = tmp_path / "d.jsonl"
    lines = write_numbered_lines(str(path), 3000)
    pipeline = numbered_pipeline(str(path), gpt2, runner, exhausted="repeat")
    iterator = iter(pipeline)
    for _ in range(1000):  # every chunk read at least once (the file makes about 450 batches)
        next(iterator)
    assert (pipeline._run._digests.known[0] != 0).all(), "every chunk was read before the edit"
    edit_in_place(str(path), 0, len(lines))  # and read again in the next epochs
    with pytest.raises(ChangedFileError, match=r"d\.jsonl, bytes \[\d+, \d+\) changed during the run"):
        for _ in range(20_000):
            next(iterator)
    pipeline.close()


@pytest.mark.parametrize("fmt", ["jsonl", "text", "parquet", "arrow"])
def test_a_chunks_digest_is_the_same_however_often_it_is_read_and_changes_with_its_bytes(tmp_path, fmt):
    from zephon.testing import write_arrow, write_jsonl, write_parquet, write_text

    write = {"jsonl": write_jsonl, "text": write_text, "parquet": write_parquet, "arrow": write_arrow}[fmt]
    docs = [{"text": f"record {i} of the file"} for i in range(200)]
    path = str(tmp_path / f"d.{'txt' if fmt == 'text' else fmt}")
    write(path, docs)
    dataset = Dataset.from_path("d", path)
    table = dataset.chunks(1, chunk_size=50, chunk_bytes=1024)
    digests = [dataset.read_chunk(table.chunk(0, i)).digest for i in range(len(table))]
    assert len(set(digests)) == len(digests), "each chunk's bytes are its own"
    assert [dataset.read_chunk(table.chunk(0, i)).digest for i in range(len(table))] == digests

    docs[3] = {"text": "record 3 of the filE"}
    write(path, docs)
    changed = Dataset.from_path("d", path)
    again = [changed.read_chunk(table.chunk(0, i)).digest for i in range(len(table))]
    assert again[0] != digests[0] and again[1:] == digests[1:]


def _saved_before_xxh3(state: dict, pipeline) -> dict:
    """``state`` as a zephon that digested chunks by SHA-256 saved it (state version 2): 16 hex
    digits, untagged (the digest itself is pinned by the last test of this file)."""
    import copy

    plan, dataset = pipeline.spec().lane_plan(), pipeline.source.datasets[0]
    old = copy.deepcopy(state)
    old["version"] = 2
    for lane, value in old["lanes"].items():
        for entry in value["digests"]:
            assert entry[2].startswith("xxh3:")
            entry[2] = dataset.read_chunk(plan.chunk(entry[0], int(lane), entry[1]), digest="sha256").digest
    return old


@pytest.mark.parametrize("runner", ["inline", "process"])
def test_a_state_saved_by_the_zephon_before_xxh3_restores_to_the_same_batches(tmp_path, gpt2, runner):
    """The state in ``support/states/numbered_v2_a8dcfe0.json`` was saved by this project at
    a8dcfe0 (SHA-256 chunk digests): ``numbered_pipeline`` over ``write_numbered_lines`` in
    another folder, inline, after 21 batches, with the digests of batches 21 to 40 of a run
    without a restore."""
    import json
    import os

    with open(os.path.join(os.path.dirname(__file__), "support", "states", "numbered_v2_a8dcfe0.json")) as f:
        saved = json.load(f)
    assert saved["state"]["version"] == 2
    path = tmp_path / "d.jsonl"
    write_numbered_lines(str(path))
    resumed = numbered_pipeline(str(path), gpt2, runner)
    resumed.load_state_dict(saved["state"])
    assert [b.digest() for b in take(resumed, 20)] == saved["batches_21_to_40"]
    again = resumed.state_dict()  # saved from here on as version 3, with XXH3
    assert again["version"] == 3
    assert all(e[2].startswith("xxh3:") for v in again["lanes"].values() for e in v["digests"])
    resumed.close()


@pytest.mark.parametrize("runner", ["inline", "process"])
def test_a_state_saved_with_sha256_digests_restores_to_the_same_batches(tmp_path, gpt2, runner):
    path = tmp_path / "d.jsonl"
    write_numbered_lines(str(path))
    reference = [b.digest() for b in take(numbered_pipeline(str(path), gpt2, "inline"), 41)]
    pipeline = numbered_pipeline(str(path), gpt2, runner)
    take(pipeline, 21)
    state = pipeline.state_dict()
    pipeline.close()
    old = _saved_before_xxh3(state, pipeline)
    assert all(len(e[2]) == 16 for v in old["lanes"].values() for e in v["digests"])

    resumed = numbered_pipeline(str(path), gpt2, runner)
    resumed.load_state_dict(old)
    assert [b.digest() for b in take(resumed, 20)] == reference[21:]
    resumed.close()


@pytest.mark.parametrize("runner", ["thread", "process"])
def test_a_state_saved_with_sha256_digests_fails_the_restore_by_name_where_a_replayed_chunk_changed(
    tmp_path, gpt2, runner
):
    import multiprocessing
    import threading
    import time

    path = tmp_path / "d.jsonl"
    write_numbered_lines(str(path))
    pipeline = numbered_pipeline(str(path), gpt2, runner)
    take(pipeline, 21)
    old = _saved_before_xxh3(pipeline.state_dict(), pipeline)
    pipeline.close()
    edit_a_replayed_chunk(str(path), numbered_pipeline(str(path), gpt2), old)

    before = set(threading.enumerate())
    resumed = numbered_pipeline(str(path), gpt2, runner)
    resumed.load_state_dict(old)
    said = r"d\.jsonl, bytes \[\d+, \d+\) changed during the run: the checkpoint's state holds it"
    with pytest.raises(ChangedFileError, match=said):
        take(resumed, 20)
    resumed.close()

    def workers_left() -> list[str]:
        threads = [
            t.name for t in threading.enumerate() if t not in before and t.name.startswith("zephon-work")
        ]
        return threads + [
            p.name for p in multiprocessing.active_children() if p.name.startswith("zephon-worker")
        ]

    deadline = time.monotonic() + 10  # the run's workers go with it (close joins them in the background)
    while workers_left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not workers_left()


def test_a_chunk_digest_names_xxh3_and_a_files_content_version_stays_sha256():
    import hashlib

    import xxhash

    from zephon.io.formats.base import content_digest

    data = b"the bytes of a chunk\n"
    framed = len(data).to_bytes(8, "little") + data
    assert content_digest(data) == "xxh3:" + xxhash.xxh3_64(framed).hexdigest()
    # a remote file's "content:" version (zephon.io.dataset): as plans and states made before hold it
    assert content_digest(data, algorithm="sha256") == hashlib.sha256(framed).hexdigest()[:16]
