"""Faults and bad input: clear errors that name what to fix, no hangs, no orphans."""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback

import psutil
import pytest
from support.functions import (
    ORPHAN_SCRIPT,
    TwoArgumentError,
    failing_on_seven,
    raises_two_argument_error,
    rename_content,
    shout,
)
from support.processes import (
    GUARDED,
    UNGUARDED,
    kill_a_worker,
    shm_files,
    stopped_worker_pipeline,
    worker_processes,
)

from zephon import Dataset, Options, Pipeline
from zephon.fingerprint import of_dataset
from zephon.io import DataError
from zephon.testing import drain, take, write_jsonl

# -- settings and states ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(num_lanes=10**20), r"num_lanes = 10+ is more than zephon takes \(65536\)"),
        (dict(num_lanes=1_000_000_001), "num_lanes = 1000000001 is more than zephon takes"),
        (dict(prefetch=10**9), "prefetch = 1000000000 is more than zephon takes"),
        (dict(window_rows=10**12), "window_rows = 1000000000000 is more than zephon takes"),
        (dict(worker_timeout=0), "worker_timeout must be a positive number of seconds"),
    ],
)
def test_settings_that_would_exhaust_memory_or_threads_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        Options(**options)


def test_a_huge_parallelism_is_refused_by_name(corpus, gpt2):
    with pytest.raises(ValueError, match=r"tokenize: parallelism must be an int from 0 to 512"):
        Pipeline(Dataset.from_path("d", corpus)).tokenize(gpt2, parallelism=10**6)


def test_launch_numbers_that_cannot_work_are_named_at_once():
    from zephon.torchtitan.checks import check_batch_geometry, divisors

    with pytest.raises(ValueError, match=r"training\.local_batch_size = 0: it must be at least 1"):
        check_batch_geometry(num_lanes=8, dp_world_size=1, local_batch_size=0, global_batch_size=16)
    with pytest.raises(ValueError, match=r"Use a DP size among \[1, 7, 11, 13, 19, 77, 91, 133"):
        check_batch_geometry(
            num_lanes=1_000_000_001, dp_world_size=2, local_batch_size=1, global_batch_size=2
        )
    assert divisors(1_000_000_001)[:4] == [1, 7, 11, 13], "found by the square root, not a billion trials"


def test_a_binary_file_given_as_a_recipe_is_named(tmp_path):
    from zephon.torchtitan.recipe import load_recipe

    path = tmp_path / "model.bin"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"model\.bin is not a TOML text file"):
        load_recipe(str(path))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s["lanes"]["0"].update(window=10**15),
            r"lane 0: malformed lane state: window = 1000000000000000 and delivered = 1 cannot exceed index",
        ),
        (
            lambda s: s["lanes"]["0"].update(delivered=10**6),
            r"lane 0: malformed lane state: window = \d+ and delivered = 1000000 cannot exceed index",
        ),
        (lambda s: s["lanes"].update({"9": s["lanes"]["0"]}), r"lanes \['9'\] that a recipe of 8 lanes"),
    ],
    ids=["window-beyond-index", "delivered-beyond-index", "lane-beyond-the-recipe"],
)
def test_impossible_states_are_refused(make_rank, change, message):
    pipeline = make_rank(1, 0)
    take(pipeline, 12)
    state = json.loads(json.dumps(pipeline.state_dict()))
    pipeline.close()
    change(state)
    with pytest.raises(ValueError, match=message):
        make_rank(1, 0).load_state_dict(state)


# -- bad data -----------------------------------------------------------------------------------


def test_states_of_ranks_saved_at_different_steps_are_not_merged(make_rank):
    from zephon import merge_states

    def state_after(rank: int, batches: int) -> dict:
        pipeline = make_rank(2, rank)
        take(pipeline, batches)
        state = pipeline.state_dict()
        pipeline.close()
        return state

    with pytest.raises(
        ValueError, match=r"state 0's lanes have delivered 5 batches, state 1's 8: .*different steps"
    ):
        merge_states([state_after(0, 20), state_after(1, 30)])
    merged = merge_states([state_after(0, 20), state_after(1, 22)])  # within one batch per lane: a step
    assert len(merged["lanes"]) == 8


def test_a_deeply_nested_json_line_names_the_file_and_line(tmp_path, gpt2):
    path = tmp_path / "deep.jsonl"
    path.write_text('{"text": "fine"}\n' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "\n")
    pipeline = Pipeline(Dataset.from_path("d", str(path))).tokenize(gpt2).pack_flat(8).batch(1)
    with pytest.raises(DataError, match=r"deep\.jsonl, line 2: JSON nested too deeply"):
        drain(pipeline, 10)


def test_a_cache_folder_that_cannot_be_written_is_named(tmp_path):
    from zephon.io.cache import BlockCache

    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(OSError, match=r"block cache folder .*a-file/cache cannot be made.*writable folder"):
        BlockCache(str(blocked / "cache"), 1 << 20, 4096)


@pytest.mark.parametrize("runner", ["thread", "process"])
def test_an_error_whose_class_takes_other_arguments_keeps_its_type_message_and_record(corpus, gpt2, runner):
    ds = Dataset.from_path("synthetic", corpus)
    pipeline = Pipeline(ds).options(runner=runner).map(raises_two_argument_error).tokenize(gpt2)
    with pytest.raises(TwoArgumentError) as caught:
        drain(pipeline.pack_flat(16).batch(1), 1)
    assert str(caught.value) == "bad record at 7-0"
    text = "".join(traceback.format_exception_only(caught.type, caught.value))
    assert "part-0.jsonl, line 1" in text, text


def test_an_error_that_cannot_be_unpickled_comes_back_from_a_worker_process_as_itself():
    from zephon.runners.process import ProcessExecutor, WorkerTraceback

    executor = ProcessExecutor(raises_two_argument_error, 1, timeout=600.0)
    try:
        deadline = time.monotonic() + 60
        while not executor.pool_up and time.monotonic() < deadline:
            time.sleep(0.05)  # the first units would run in this process
        error = executor.submit({"id": 3}).exception(60)
        again = executor.submit({"id": 4}).exception(60)
    finally:
        executor.shutdown()
    assert isinstance(error.__cause__, WorkerTraceback), "it was raised in a worker process"
    assert "raises_two_argument_error" in str(error.__cause__), "its traceback there comes along"
    assert isinstance(error, TwoArgumentError) and str(error) == "bad record at 3"
    assert isinstance(again, TwoArgumentError) and str(again) == "bad record at 4", "the pool lives on"


def test_an_error_whose_class_the_parent_cannot_import_comes_back_as_its_text():
    from zephon.runners.process import _rebuild

    error = _rebuild("no_such_module", "Gone", ("why",), {}, "why", "no_such_module.Gone: why")
    assert type(error) is RuntimeError
    assert str(error) == "no_such_module.Gone: why (raised in a worker process)"


# -- stuck workers, orphans, leaks ----------------------------------------------------------------


def _seconds_to_fail_after_stopping(pipeline, iterator, workers, message) -> float:
    for p in workers:
        p.send_signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=message):
            for _ in range(10**6):
                next(iterator)
        return time.monotonic() - start
    finally:
        for p in workers:
            with contextlib.suppress(psutil.NoSuchProcess):  # the run may have ended it already
                p.send_signal(signal.SIGCONT)
        pipeline.close()


@pytest.mark.slow  # waits on timeouts or servers by design: seconds
def test_a_stopped_worker_is_reported_with_its_file_soon_after_worker_timeout(tmp_path, gpt2):
    from zephon.runners.process import STARTING

    pipeline = stopped_worker_pipeline(str(tmp_path), gpt2, timeout=5)
    iterator = iter(pipeline)
    executor = pipeline._run._delivery.executor
    deadline = time.monotonic() + 60
    while executor.stuck(0) is STARTING and time.monotonic() < deadline:
        next(iterator)  # until the workers have started and are reading
    workers = worker_processes()
    assert workers and executor.stuck(0) is not STARTING, "the process runner's workers are up"
    message = r"lane \d+: dataset 'd', .*/d\.jsonl, bytes \[\d+, \d+\) has not come back .* in 5 s: a worker"
    seconds = _seconds_to_fail_after_stopping(pipeline, iterator, workers, message)
    print(f"\nreported {seconds:.1f} s after the worker stopped")
    assert seconds < 5 + 2, "timed from when the worker took the chunk, not from when the lane waited"


@pytest.mark.slow  # waits on timeouts or servers by design: seconds
def test_workers_that_do_not_come_up_are_reported_soon_after_worker_timeout(tmp_path, gpt2):
    """Workers start from the fork server, which loads the tokenizer first: here it is stopped
    (as a server stuck loading would be), so no worker comes up, while this process runs the
    first units itself. The start is timed from when the pool was made."""
    from multiprocessing import forkserver

    from zephon.runners.process import _context

    _context()
    forkserver.ensure_running()  # (the one the earlier tests started, where they did)
    server = psutil.Process(forkserver._forkserver._forkserver_pid)
    pipeline = stopped_worker_pipeline(str(tmp_path), gpt2, timeout=3)
    message = r"the start of the worker processes \(each loads the work: its tokenizer\) has not ended in 3 s"
    server.send_signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=message):
            iterator = iter(pipeline)
            while time.monotonic() < start + 30:  # (served here unseen, it had gone on for ever)
                next(iterator)
        seconds = time.monotonic() - start
    finally:
        server.send_signal(signal.SIGCONT)
        pipeline.close()
    print(f"\nreported {seconds:.1f} s after the pool was made")
    assert seconds < 3 + 2, "the start is timed from when the pool was made, not after it"


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_worker_processes_die_with_the_pipeline_process(corpus, gpt2, how):
    command = [sys.executable, "-c", ORPHAN_SCRIPT, corpus, gpt2]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in child.stdout.readline().split()]
    assert len(pids) >= 2, "a fork server and its workers"
    child.send_signal(how)
    child.wait(timeout=30)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    assert not [pid for pid in pids if _alive(pid)], "processes outlived the pipeline's process"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_script_without_a_main_guard_is_told_at_once_what_to_add(tmp_path, corpus, gpt2):
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED)
    result = subprocess.run(
        [sys.executable, str(script), corpus, gpt2], capture_output=True, text=True, timeout=120
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and "done" not in result.stdout, result.stderr[-3000:]
    assert lines[-1] == (
        f"ValueError: runner='process': {script}, line 9 starts worker processes from the top level of "
        "the script, and each worker imports the script again, so it would run that line again: put the "
        'script\'s code under `if __name__ == "__main__":` (or use runner="thread")'
    )
    assert len(lines) < 30 and "multiprocessing" not in result.stderr, result.stderr


def test_a_script_with_a_main_guard_runs_on_process_workers(tmp_path, corpus, gpt2):
    script = tmp_path / "train.py"
    script.write_text(GUARDED)
    result = subprocess.run(
        [sys.executable, str(script), corpus, gpt2], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout == "done\n" and not result.stderr, result.stderr[-3000:]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
@pytest.mark.parametrize(
    ("kill", "end"),
    [("writing", "close"), ("writing", "exit"), ("random1", "close"), ("random2", "exit")],
)
def test_a_worker_killed_while_handing_results_over_leaves_nothing_in_shared_memory(
    tmp_path, gpt2, kill, end
):
    pid, out, err = kill_a_worker(str(tmp_path), gpt2, kill, end)
    assert "error:" in out, err[-3000:]
    died = r"error: RuntimeError lane \d: a worker died while on dataset 'd', \S*d\.jsonl, bytes \["
    assert re.search(died, out), out
    if kill == "writing":
        # each worker kills itself half way through its first write: one file, or two where the two
        # wrote at once (they start together); either way there until the pipeline ends
        assert re.search(r"left: [12]\n", out), "the half-written result is there until the pipeline ends"
    if end == "close":
        assert "after close: []" in out
    assert shm_files(pid) == []


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_what_a_killed_owner_left_in_shared_memory_goes_with_the_next_pool_once_old(tmp_path, gpt2):
    from zephon.runners import handover

    # the worker dies writing, the broken pool takes the other one down, then the owner is killed
    pid, out, err = kill_a_worker(str(tmp_path), gpt2, "writing", "sigkill")
    assert "error:" in out, err[-3000:]
    left = shm_files(pid)  # nobody was left to remove them: one, or two where both workers wrote at once
    assert 1 <= len(left) <= 2, left
    paths = [os.path.join("/dev/shm", name) for name in left]
    handover.remove_all(handover.prefix())  # a new pool, soon after: they could still be read
    assert all(os.path.exists(path) for path in paths)
    past = time.time() - 24 * 3600
    for path in paths:
        os.utime(path, (past, past))
    handover.remove_all(handover.prefix())
    assert not any(os.path.exists(path) for path in paths)


def test_a_finished_run_lets_its_workers_go(tmp_path, gpt2):
    write_jsonl(str(tmp_path / "d.jsonl"), [{"text": f"document {i} " * 20} for i in range(300)])
    pipeline = Pipeline(Dataset.from_path("d", str(tmp_path / "d.jsonl"))).options(runner="process")
    pipeline = pipeline.map(shout).tokenize(gpt2).pack_flat(64).batch(1)
    before = {p.pid for p in worker_processes()}  # those of a run an earlier failed test still holds

    def this_runs_workers() -> list:
        return [p for p in worker_processes() if p.pid not in before]

    assert list(pipeline), "the dataset stops: the run ends"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and this_runs_workers():
        time.sleep(0.1)
    assert not this_runs_workers(), "the run ended but its worker processes are still there"


def _zephon_threads() -> list[str]:
    """The threads of runs (the reaper is the process's, started once)."""
    return [
        t.name for t in threading.enumerate() if t.name.startswith("zephon-") and t.name != "zephon-reaper"
    ]


def _no_lane_threads_left() -> None:
    """Wait until the runs earlier tests dropped have stopped (the reaper closes them)."""
    gc.collect()
    deadline = time.monotonic() + 10
    while "zephon-lanes" in _zephon_threads() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_pipeline_dropped_in_the_middle_of_a_run_leaves_no_thread(make_rank):
    before = set(threading.enumerate())  # threads of earlier tests' runs may end meanwhile

    def new_threads() -> list[str]:
        return [t.name for t in threading.enumerate() if t not in before and t.name in _zephon_threads()]

    pipeline = make_rank(1, 0, runner="thread")
    iterator = iter(pipeline)
    for _ in range(5):
        next(iterator)
    assert new_threads(), "the run has threads of its own"
    del pipeline, iterator
    gc.collect()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and new_threads():
        time.sleep(0.05)
    assert new_threads() == []


def test_lanes_are_driven_by_one_thread_however_many_there_are(corpus, gpt2):
    _no_lane_threads_left()
    before = set(threading.enumerate())  # a run an earlier failed test still holds is not this one's
    ds = Dataset.from_path("d", corpus, exhausted="repeat")
    pipeline = Pipeline(ds).options(num_lanes=256, chunk_bytes=1024).tokenize(gpt2).pack_flat(16).batch(1)
    take(pipeline, 300)
    assert [t.name for t in threading.enumerate() if t not in before].count("zephon-lanes") == 1
    pipeline.close()


def test_batches_made_ahead_stay_within_the_memory_budget_and_the_needed_lane_still_advances():
    from zephon.runners.background import LaneDriver

    made = []

    def lane(n):
        for i in itertools.count():
            made.append(n)
            yield i

    def held_after(budget):
        made.clear()
        driver = LaneDriver({0: lambda: lane(0), 1: lambda: lane(1)}, {0: 0, 1: 0}, lambda i: i, 10,
                            budget, lambda item: 100)  # fmt: skip
        time.sleep(0.2)
        held = driver.held
        got = [driver.next(0) for _ in range(5)]  # the consumer drains lane 0: it goes on
        driver.close()
        return held, got

    assert held_after(1 << 62) == (2000, [0, 1, 2, 3, 4])  # depth 10 on both lanes
    held, got = held_after(250)
    assert held == 300 and got == [0, 1, 2, 3, 4]


# -- where a bad record is ------------------------------------------------------------------------


def _error_of(pipeline) -> str:
    with pytest.raises(Exception) as caught:
        drain(pipeline, 10**6)
    return " ".join([str(caught.value), *getattr(caught.value, "__notes__", [])])


def test_a_record_without_the_field_is_named_by_file_and_line(tmp_path, gpt2):
    records = [{"text": f"line {i}"} for i in range(500)]
    records[321] = {"body": "no text here"}
    path = write_jsonl(str(tmp_path / "d.jsonl"), records)
    pipeline = (
        Pipeline(Dataset.from_path("d", path)).options(chunk_bytes=1024).tokenize(gpt2).pack_flat(8).batch(1)
    )
    message = _error_of(pipeline)
    assert "d.jsonl, line 322: tokenize(field='text'): the record has no such field" in message, message


def test_a_record_whose_field_is_not_text_is_named_by_file_and_row(tmp_path, gpt2):
    from zephon.testing import write_parquet

    records = [{"text": f"row {i}"} for i in range(300)]
    records[200] = {"text": None}
    path = write_parquet(str(tmp_path / "d.parquet"), records, row_group_size=64)
    pipeline = (
        Pipeline(Dataset.from_path("d", path)).options(chunk_size=50).tokenize(gpt2).pack_flat(8).batch(1)
    )
    message = _error_of(pipeline)
    assert "d.parquet, row 200: tokenize(field='text'): expected a string, got NoneType" in message, message


def test_a_parquet_dataset_without_the_column_to_tokenize_is_named_before_any_batch(tmp_path, gpt2):
    from zephon.testing import write_parquet

    path = write_parquet(str(tmp_path / "d.parquet"), [{"content": f"row {i}"} for i in range(300)], 64)
    pipeline = Pipeline(Dataset.from_path("d", path)).tokenize(gpt2).pack_flat(8).batch(1)
    message = r"tokenize\(field='text'\), but .*d\.parquet has no such column; its columns are \['content'\]"
    with pytest.raises(ValueError, match=message):
        next(iter(pipeline))  # the plan is made before the first batch
    renamed = Pipeline(Dataset.from_path("d", path)).map(rename_content).tokenize(gpt2).pack_flat(8).batch(1)
    assert len(take(renamed, 3)) == 3  # a map may make the field: no check then


def test_a_truncated_gzip_file_is_named_as_damaged(tmp_path, gpt2):
    import gzip

    data = "".join(json.dumps({"text": f"row {i} " * 20}) + "\n" for i in range(3000)).encode()
    packed = gzip.compress(data)
    (tmp_path / "t.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    ds = Dataset.from_path("d", str(tmp_path / "t.jsonl.gz"))
    pipeline = Pipeline(ds).options(num_lanes=2, io_options={"cache": {"dir": str(tmp_path / "cache")}})
    message = _error_of(pipeline.tokenize(gpt2).pack_flat(8).batch(1))
    assert "t.jsonl.gz: the gzip data is damaged or truncated" in message, message


@pytest.mark.parametrize("runner", ["thread", "process"])
def test_a_map_function_error_keeps_its_type_and_says_which_record(tmp_path, gpt2, runner):
    path = write_jsonl(str(tmp_path / "d.jsonl"), [{"text": f"line {i}"} for i in range(20)])
    pipeline = Pipeline(Dataset.from_path("d", path)).options(runner=runner).map(failing_on_seven)
    with pytest.raises(KeyError) as caught:
        drain(pipeline.tokenize(gpt2).pack_flat(8).batch(1), 100)
    assert any("d.jsonl, line 8" in note for note in getattr(caught.value, "__notes__", [])), caught.value


# -- data that changed ----------------------------------------------------------------------------


def test_a_local_file_replaced_by_a_same_size_reordered_copy_is_refused_on_restore(tmp_path, gpt2):
    lines = [json.dumps({"text": f"document number {i:05d} " * 8}) for i in range(3000)]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")

    def make():
        ds = Dataset.from_path("d", str(path), exhausted="repeat")
        return Pipeline(ds).options(num_lanes=2).tokenize(gpt2).pack_flat(32).batch(2)

    pipeline = make()
    take(pipeline, 10)
    state = pipeline.state_dict()
    pipeline.close()
    size = path.stat().st_size
    path.write_text("\n".join(reversed(lines)) + "\n")
    assert path.stat().st_size == size
    with pytest.raises(ValueError, match=r"different recipe; changed: source\.datasets\.d"):
        make().load_state_dict(state)


def test_a_restore_refused_because_a_file_changed_names_that_file(tmp_path, gpt2):
    parts = [[json.dumps({"text": f"part {p} document {i:05d} " * 4}) for i in range(800)] for p in range(3)]
    for p, lines in enumerate(parts):
        (tmp_path / f"part-{p}.jsonl").write_text("\n".join(lines) + "\n")

    def make():
        ds = Dataset.from_path("d", str(tmp_path), exhausted="repeat")
        return Pipeline(ds).options(num_lanes=2).tokenize(gpt2).pack_flat(32).batch(2)

    pipeline = make()
    take(pipeline, 10)
    state = pipeline.state_dict()
    pipeline.close()
    assert len(json.dumps(state["fingerprint"])) < 1000
    (tmp_path / "part-1.jsonl").write_text("\n".join(reversed(parts[1])) + "\n")  # same size
    with pytest.raises(ValueError) as caught:
        make().load_state_dict(state)
    message = str(caught.value)
    print("\n" + message)
    assert re.search(
        r"changed: source\.datasets\.d\.files: \S+/part-1\.jsonl \(now \d+ bytes, version 'sample:\w+'\) "
        r"changed since the checkpoint: put the original back to continue the run, or start a new run$",
        message,
    )
    assert "part-0" not in message and "part-2" not in message


def test_the_files_of_a_large_dataset_stay_small_in_the_fingerprint_and_name_a_group():
    from zephon.io.chunks import Shard
    from zephon.io.versions import FileVersions

    shards = [Shard(f"s3://b/data/part-{i:05d}.parquet", 1000 + i, f"etag{i}") for i in range(5000)]
    saved = json.loads(json.dumps(FileVersions.of(shards, "s3://b/data/")))
    assert len(saved) < 9 * 1024
    shards[2345] = Shard(shards[2345].url, shards[2345].size, "etag-new")
    now = FileVersions.of(shards, "s3://b/data/")
    assert now != saved and now.explain(saved) == [
        "one of the 5 files s3://b/data/part-02345.parquet ... s3://b/data/part-02349.parquet changed since "
        "the checkpoint: put the original back to continue the run, or start a new run"
    ]
    fewer = FileVersions.of(shards[:-1], "s3://b/data/")
    assert fewer.explain(saved) == ["files were added, removed or renamed (5000 files then, 4999 now)"]


def test_a_cache_entry_copied_over_another_key_is_fetched_again(tmp_path):
    from support.damage import cache_with_a_copied_entry

    cache, data, fetch, fetched = cache_with_a_copied_entry(str(tmp_path))
    assert cache.read("u", len(data), "v1", 0, 4096, fetch) == data[:4096]
    assert fetched == [(0, 4096)] and cache.damaged == 1


# -- on_error="skip" ------------------------------------------------------------------------------


def _corpus_with_bad_records(folder) -> tuple[str, list[int]]:
    """Three shards of real-looking records with four bad lines among them: a malformed line,
    one without the field, one whose field is a number and one the map function fails on.
    Returns the folder and the bad lines' numbers (1-based) in part-1.jsonl."""
    from zephon.testing import synthetic_documents

    docs = [d for d in synthetic_documents(1000, seed=3) if not d["text"].endswith(" 7")][:900]
    bad = {40: "{not json", 170: json.dumps({"body": "no text"}), 260: json.dumps({"text": 12}),
           290: json.dumps({"text": "this one fails in the map 7"})}  # fmt: skip
    for part in range(3):
        lines = [json.dumps(d) for d in docs[part * 300 : (part + 1) * 300]]
        if part == 1:
            for line, text in bad.items():
                lines.insert(line - 1, text)
        (folder / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")
    return str(folder), sorted(bad)


def _skipping(folder: str, gpt2, world=1, rank=0, **options):
    ds = Dataset.from_path("d", folder, exhausted="repeat", on_error="skip")
    return (
        Pipeline(ds)
        .options(dp_rank=rank, dp_world_size=world, num_lanes=4, chunk_bytes=4096, **options)
        .map(failing_on_seven)
        .tokenize(gpt2)
        .pack_flat(max_length=64)
        .shuffle(buffer_size=8, seed=1)
        .batch(microbatch_size=2)
    )


@pytest.mark.parametrize("runner", ["inline", "process"])
def test_skipped_records_are_named_counted_and_left_out(tmp_path, gpt2, caplog, runner):
    folder, bad_lines = _corpus_with_bad_records(tmp_path)
    raising = Pipeline(Dataset.from_path("d", folder)).options(num_lanes=4, chunk_bytes=4096)
    message = _error_of(raising.tokenize(gpt2).pack_flat(64).batch(2))
    first = re.search(r"part-1\.jsonl, line (\d+): ", message)
    assert first and int(first.group(1)) in bad_lines[:3]  # (the fourth fails only in the map)
    pipeline = _skipping(folder, gpt2, runner=runner)
    with caplog.at_level("WARNING", logger="zephon"):
        drain(pipeline, 1500)  # more than one epoch (about 740 batches): every record is read
    stats = pipeline.stats()
    assert stats["counters"]["skipped_records"] >= 4
    if runner == "inline":  # (worker processes log to their own stderr)
        named = " ".join(r.getMessage() for r in caplog.records)
        for line in bad_lines:
            assert f"part-1.jsonl, line {line}:" in named, named
        assert "part-1.jsonl, line 41:" not in named  # the good line after the malformed one
    state = pipeline.state_dict()
    assert (
        sum(lane["counters"]["skipped_records"] for lane in state["lanes"].values())
        == (stats["counters"]["skipped_records"])
    )


def test_an_epoch_skips_exactly_the_bad_records_and_keeps_every_good_one(tmp_path, gpt2):
    folder, _ = _corpus_with_bad_records(tmp_path)
    ds = Dataset.from_path("d", folder, on_error="skip")
    pipeline = Pipeline(ds).options(num_lanes=4, chunk_bytes=4096).map(failing_on_seven).tokenize(gpt2)
    pipeline = pipeline.pack_flat(max_length=64).batch(microbatch_size=2)
    drain(pipeline, 10**6)
    stats = pipeline.stats()
    assert stats["counters"]["skipped_records"] == 4
    assert stats["documents"]["d"] == 900


def test_skipping_is_the_same_on_any_dp_size_and_across_resumes(tmp_path, gpt2):
    from zephon.testing import run_job

    folder, _ = _corpus_with_bad_records(tmp_path)

    def make(world, rank):
        return _skipping(folder, gpt2, world, rank)

    whole, end = run_job(make, 1, 40, 1)
    first, state = run_job(make, 2, 13, 1)
    second, state = run_job(make, 4, 27, 1, state)
    assert {**first, **second} == whole
    assert state["lanes"] == end["lanes"]  # counters of skipped records included
    skipped = sum(lane["counters"].get("skipped_records", 0) for lane in end["lanes"].values())
    assert skipped >= 2  # the run crossed some of them


def test_on_error_takes_only_raise_or_skip_and_is_part_of_the_recipe(tmp_path):
    path = write_jsonl(str(tmp_path / "d.jsonl"), [{"text": "a b c"}] * 4)
    with pytest.raises(ValueError, match=r"'d': on_error='ignore', expected one of \('raise', 'skip'\)"):
        Dataset.from_path("d", path, on_error="ignore")
    raising, skipping = (of_dataset(Dataset.from_path("d", path, on_error=e)) for e in ("raise", "skip"))
    assert raising != skipping


def test_a_text_over_the_size_limit_is_named_or_skipped(tmp_path, gpt2, monkeypatch):
    from zephon.ops import tokenize

    monkeypatch.setattr(tokenize, "MAX_TEXT", 1000)
    records = [{"text": f"line {i}"} for i in range(50)]
    records[30] = {"text": "word " * 400}
    path = write_jsonl(str(tmp_path / "d.jsonl"), records)
    for on_error in ("raise", "skip"):
        ds = Dataset.from_path("d", path, on_error=on_error)
        pipeline = Pipeline(ds).options(runner="inline").tokenize(gpt2).pack_flat(8).batch(1)
        if on_error == "raise":
            message = _error_of(pipeline)
            expected = "line 31: tokenize(field='text'): a text of 2,000 characters, over the limit of 1,000"
            assert f"d.jsonl, {expected}" in message, message
        else:
            drain(pipeline, 10**6)
            assert pipeline.stats()["counters"]["skipped_records"] == 1
