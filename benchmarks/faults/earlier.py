"""The cases of the first reliability issue (numbered as it numbered them): files that change,
impossible states, the cache, bad data, settings, worker processes, a store that is down."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time

from support.corpora import rank_pipeline, write_corpus

from benchmarks.faults import (
    Outcome,
    case,
    iterate_until_error,
    lines,
    state_after,
    timed,
    tokens,
    write_lines,
)


def s3_bucket() -> tuple:
    """moto's S3 with bucket ``corpus``: (server, boto3 client, storage_options)."""
    import boto3
    from support.fakes3 import moto_s3

    server, storage = moto_s3()
    return server, boto3.client("s3", **storage["client_kwargs"]), storage


def reversed_lines(data: bytes) -> bytes:
    return b"".join(reversed(data.splitlines(keepends=True)))


# -- 1-3: remote files that change ---------------------------------------------------------------


def _s3_replace(tmp: str, gpt2: str, io_options: dict) -> tuple:
    from zephon import Dataset

    _server, client, storage = s3_bucket()
    original = ("\n".join(lines()) + "\n").encode()
    client.put_object(Bucket="corpus", Key="d.jsonl", Body=original)
    ds = Dataset.from_path("s3", "s3://corpus/d.jsonl", storage_options=storage)
    pipeline = tokens(ds, gpt2, num_lanes=2, chunk_bytes=8192, io_options=io_options)
    iterator = iter(pipeline)
    for _ in range(5):
        next(iterator)
    client.put_object(Bucket="corpus", Key="d.jsonl", Body=reversed_lines(original))
    error, seconds = timed(lambda: iterate_until_error(iterator))
    pipeline.close()
    return error, seconds, client, storage, original


@case("1-s3-same-size-replace")
def s3_same_size_replace(tmp, gpt2):
    error, seconds, *_ = _s3_replace(tmp, gpt2, {})
    return error, seconds, "timed from the put_object (after 5 batches) to the error"


@case("2-s3-replace-with-cache")
def s3_replace_with_cache(tmp, gpt2):
    from zephon import Dataset
    from zephon.io import IOConfig

    options = {"cache": {"enabled": True, "dir": os.path.join(tmp, "cache"), "block_size": 1 << 12}}
    error, seconds, client, storage, original = _s3_replace(tmp, gpt2, options)
    client.put_object(Bucket="corpus", Key="d.jsonl", Body=original)
    config = IOConfig.parse(options)
    again = Dataset.from_path("s3", "s3://corpus/d.jsonl", storage_options=storage)
    table = again.chunks(1, chunk_size=300, chunk_bytes=1 << 16, io=config)
    records = [r for i in range(len(table)) for r in again.read(table.chunk(0, i), config)]
    spared = records == [json.loads(x) for x in original.splitlines()]
    return error, seconds, f"original put back, fresh pass through the cache: cache spared: {spared}"


@case("3-http-no-etag-update")
def http_no_etag_update(tmp, gpt2):
    import urllib.request

    from support.fakehttp import FileServer

    from zephon import Dataset

    www = os.path.join(tmp, "www")
    os.makedirs(www)
    rows = lines()
    path = write_lines(os.path.join(www, "d.jsonl"), rows, 1_700_000_000)
    server = FileServer(www).start()
    url = server.url + "/d.jsonl"

    def make():
        ds = Dataset.from_path("web", url, exhausted="repeat")
        return tokens(ds, gpt2, num_lanes=2, chunk_bytes=8192)

    state = state_after(make(), 10)
    write_lines(path, rows[::-1], 1_700_000_100)  # same size, a later date
    headers = urllib.request.urlopen(urllib.request.Request(url, method="HEAD")).headers
    error, seconds = timed(lambda: make().load_state_dict(state))
    server.stop()
    note = f"server sends ETag: {headers.get('ETag')}, Last-Modified: {headers.get('Last-Modified')}"
    return error, seconds, note + "; timed: new pipeline + load_state_dict"


# -- 4, 17: local files that change between save and restore -------------------------------------


@case("4-local-reordered-restore")
def local_reordered_restore(tmp, gpt2):
    from zephon import Dataset

    rows = lines()
    path = write_lines(os.path.join(tmp, "d.jsonl"), rows)

    def make():
        return tokens(Dataset.from_path("d", path, exhausted="repeat"), gpt2, num_lanes=2)

    state = state_after(make(), 10)
    size = os.path.getsize(path)
    write_lines(path, rows[::-1])
    assert os.path.getsize(path) == size
    error, seconds = timed(lambda: make().load_state_dict(state))
    return error, seconds, "timed: new pipeline + load_state_dict"


@case("17-restore-changed-file-named")
def restore_changed_file_named(tmp, gpt2):
    from zephon import Dataset

    folder = os.path.join(tmp, "parts")
    os.makedirs(folder)
    parts = [[json.dumps({"text": f"part {p} document {i:05d} " * 4}) for i in range(800)] for p in range(3)]
    for p, rows in enumerate(parts):
        write_lines(os.path.join(folder, f"part-{p}.jsonl"), rows)

    def make():
        return tokens(Dataset.from_path("d", folder, exhausted="repeat"), gpt2, num_lanes=2)

    state = state_after(make(), 10)
    write_lines(os.path.join(folder, "part-1.jsonl"), parts[1][::-1])  # same size
    error, seconds = timed(lambda: make().load_state_dict(state))
    named = error is not None and "part-1" in str(error) and "part-0" not in str(error)
    return error, seconds, f"names part-1 only: {named}"


# -- 5: impossible states -------------------------------------------------------------------------


def _impossible(tmp, gpt2, change):
    folder = write_corpus(os.path.join(tmp, "corpus"))
    state = state_after(rank_pipeline(folder, gpt2, 1, 0), 12)
    change(state)
    error, seconds = timed(lambda: rank_pipeline(folder, gpt2, 1, 0).load_state_dict(state))
    return error, seconds, "state after 12 batches"


@case("5a-delivered-huge")
def delivered_huge(tmp, gpt2):
    return _impossible(tmp, gpt2, lambda s: s["lanes"]["0"].update(delivered=10**6))


@case("5b-window-huge")
def window_huge(tmp, gpt2):
    return _impossible(tmp, gpt2, lambda s: s["lanes"]["0"].update(window=10**15))


@case("5d-extra-lane")
def extra_lane(tmp, gpt2):
    return _impossible(tmp, gpt2, lambda s: s["lanes"].update({"9": s["lanes"]["0"]}))


@case("5c-merge-steps-20-30")
def merge_steps(tmp, gpt2):
    from zephon import merge_states

    folder = write_corpus(os.path.join(tmp, "corpus"))
    states = [
        state_after(rank_pipeline(folder, gpt2, 2, 0), 20),
        state_after(rank_pipeline(folder, gpt2, 2, 1), 30),
    ]
    error, seconds = timed(lambda: merge_states(states))
    return error, seconds, "ranks 0 and 1 of 2, saved after 20 and 30 batches"


# -- 6, 15: the cache ------------------------------------------------------------------------------


@case("6-cache-entry-copied")
def cache_entry_copied(tmp, gpt2):
    from support.damage import cache_with_a_copied_entry

    cache, data, fetch, fetched = cache_with_a_copied_entry(os.path.join(tmp, "cache"))
    got = []
    error, seconds = timed(lambda: got.append(cache.read("u", len(data), "v1", 0, 4096, fetch)))
    again = fetched == [(0, 4096)] and got == [data[:4096]]
    return error, seconds, f"fetched again: {again} (damaged={cache.damaged}); no error is the intent"


@case("15-readonly-cache", drop_root=True)
def readonly_cache(tmp, gpt2):
    from support.fakehttp import FileServer

    from zephon import Dataset
    from zephon.testing import drain

    www, folder = os.path.join(tmp, "www"), os.path.join(tmp, "readonly-cache")
    os.makedirs(www)
    os.makedirs(folder)
    write_lines(os.path.join(www, "d.jsonl"), lines())
    os.chmod(folder, 0o555)
    writable = os.access(folder, os.W_OK)
    server = FileServer(www).start()
    ds = Dataset.from_path("web", server.url + "/d.jsonl")
    options = {"cache": {"enabled": True, "dir": folder}}
    pipeline = tokens(ds, gpt2, num_lanes=2, chunk_bytes=8192, io_options=options)
    error, seconds = timed(lambda: drain(pipeline, 10**6))
    server.stop()
    os.chmod(folder, 0o755)
    how = "root without CAP_DAC_OVERRIDE (setpriv)" if os.geteuid() == 0 else "a normal user"
    return error, seconds, f"HTTP source, cache dir mode 0555, run as {how}; writable anyway: {writable}"


# -- 7, 14, 19: bad data -------------------------------------------------------------------------


@case("7-one-300MB-line", timeout=300)
def one_300mb_line(tmp, gpt2):
    from zephon import Dataset, Pipeline
    from zephon.testing import drain

    path = os.path.join(tmp, "huge.jsonl")
    with open(path, "w") as f:  # written in pieces, so the writing adds nothing to the peak
        f.write('{"text": "')
        for _ in range(300):
            f.write("word " * 200_000)  # 1 MB
        f.write('"}\n')
        for i in range(100):
            f.write(json.dumps({"text": f"line {i}"}) + "\n")
    size = os.path.getsize(path)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    pipeline = (
        Pipeline(Dataset.from_path("d", path)).options(runner="inline").tokenize(gpt2).pack_flat(8).batch(1)
    )
    error, seconds = timed(lambda: drain(pipeline, 10**6))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (
        error,
        seconds,
        f"file {size / 1e6:.0f} MB; peak RSS {peak / 1024:.0f} MiB (before the run {before / 1024:.0f} MiB)",
    )


@case("14-deep-json")
def deep_json(tmp, gpt2):
    from zephon import Dataset, Pipeline
    from zephon.testing import drain

    path = os.path.join(tmp, "deep.jsonl")
    with open(path, "w") as f:
        f.write('{"text": "fine"}\n' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "\n")
    pipeline = Pipeline(Dataset.from_path("d", path)).tokenize(gpt2).pack_flat(8).batch(1)
    return (*timed(lambda: drain(pipeline, 10)), "line 2 nested 100,000 deep")


def _bad_data(gpt2, path, **options):
    from zephon import Dataset
    from zephon.testing import drain

    pipeline = tokens(Dataset.from_path("d", path), gpt2, length=8, rows=1, **options)
    return timed(lambda: drain(pipeline, 10**6))


@case("19a-missing-field")
def missing_field(tmp, gpt2):
    from zephon.testing import write_jsonl

    records = [{"text": f"line {i}"} for i in range(500)]
    records[321] = {"body": "no text here"}
    path = write_jsonl(os.path.join(tmp, "d.jsonl"), records)
    return (*_bad_data(gpt2, path, chunk_bytes=1024), "line 322 has 'body', no 'text'")


@case("19b-non-string-field")
def non_string_field(tmp, gpt2):
    from zephon.testing import write_parquet

    records = [{"text": f"row {i}"} for i in range(300)]
    records[200] = {"text": None}
    path = write_parquet(os.path.join(tmp, "d.parquet"), records, row_group_size=64)
    return (*_bad_data(gpt2, path, chunk_size=50), "Parquet row 200: text is null")


@case("19c-wrong-parquet-column")
def wrong_parquet_column(tmp, gpt2):
    from zephon.testing import write_parquet

    records = [{"content": f"row {i}"} for i in range(300)]
    path = write_parquet(os.path.join(tmp, "d.parquet"), records, row_group_size=64)
    return (*_bad_data(gpt2, path, chunk_size=50), "Parquet column 'content'; tokenize(field='text')")


@case("19d-truncated-jsonl-gz")
def truncated_gzip(tmp, gpt2):
    import gzip

    data = "".join(json.dumps({"text": f"row {i} " * 20}) + "\n" for i in range(3000)).encode()
    packed = gzip.compress(data)
    path = os.path.join(tmp, "t.jsonl.gz")
    with open(path, "wb") as f:
        f.write(packed[: len(packed) // 2])
    options = {"cache": {"dir": os.path.join(tmp, "cache")}}
    return (*_bad_data(gpt2, path, num_lanes=2, io_options=options), "first half of the gzip stream")


# -- 8, 16: settings -------------------------------------------------------------------------------


@case("8-num-lanes-1e9+1")
def num_lanes_billion(tmp, gpt2):
    from zephon import Dataset, Pipeline

    path = write_lines(os.path.join(tmp, "d.jsonl"), lines(100))
    pipeline = Pipeline(Dataset.from_path("d", path))
    return (*timed(lambda: pipeline.options(num_lanes=1_000_000_001)), "Pipeline(...).options(...)")


@case("16a-local-batch-0")
def local_batch_zero(tmp, gpt2):
    from zephon.torchtitan.checks import check_batch_geometry

    def check():
        check_batch_geometry(num_lanes=8, dp_world_size=1, local_batch_size=0, global_batch_size=16)

    return (*timed(check), "check_batch_geometry")


@case("16b-num-lanes-1e20")
def num_lanes_huge(tmp, gpt2):
    from zephon import Options

    return (*timed(lambda: Options(num_lanes=10**20)), "Options(num_lanes=10**20)")


@case("16c-binary-recipe")
def binary_recipe(tmp, gpt2):
    from zephon.torchtitan.recipe import load_recipe

    path = os.path.join(tmp, "model.bin")
    with open(path, "wb") as f:
        f.write(bytes(range(256)) * 4)
    return (*timed(lambda: load_recipe(path)), "load_recipe of 1 KiB of binary")


# -- 9, 10, 13: worker processes -----------------------------------------------------------------


@case("9-sigstop-worker")
def sigstop_worker(tmp, gpt2):
    from support.processes import stopped_worker_pipeline, worker_processes

    pipeline = stopped_worker_pipeline(tmp, gpt2, timeout=2)
    iterator = iter(pipeline)
    next(iterator)
    workers = worker_processes()
    if not workers:
        raise Outcome("no worker process found to stop")
    workers[0].send_signal(signal.SIGSTOP)
    try:
        error, seconds = timed(lambda: iterate_until_error(iterator))
    finally:
        workers[0].send_signal(signal.SIGCONT)
        pipeline.close()
    return error, seconds, f"worker_timeout=2; stopped 1 of {len(workers)} workers; timed from the SIGSTOP"


@case("10-parent-killed")
def parent_killed(tmp, gpt2):
    import psutil
    from support.functions import ORPHAN_SCRIPT

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    command = [sys.executable, "-c", ORPHAN_SCRIPT, write_corpus(os.path.join(tmp, "corpus")), gpt2]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in child.stdout.readline().split()]
    if not pids:
        raise Outcome(f"the pipeline process started no other process (exit {child.poll()})")
    child.send_signal(signal.SIGKILL)
    start = time.monotonic()
    child.wait(timeout=30)
    while time.monotonic() - start < 30 and any(alive(p) for p in pids):
        time.sleep(0.05)
    seconds, left = time.monotonic() - start, [p for p in pids if alive(p)]
    for pid in left:  # started (indirectly) by this case: end them
        os.kill(pid, signal.SIGKILL)
    note = f"{len(pids)} processes (fork server, resource tracker, workers); left after 30 s: {left}"
    return None, seconds, note + "; timed from the SIGKILL until all are gone"


@case("13-unpicklable-worker-error")
@case("22.9-worker-exception-type")  # (9) of issue 22: the same error, now kept as its type
def unpicklable_worker_error(tmp, gpt2):
    from support.functions import raises_two_argument_error

    from zephon import Dataset, Pipeline
    from zephon.testing import drain

    ds = Dataset.from_path("synthetic", write_corpus(os.path.join(tmp, "corpus")))
    pipeline = Pipeline(ds).options(runner="process").map(raises_two_argument_error).tokenize(gpt2)
    return (*timed(lambda: drain(pipeline.pack_flat(16).batch(1), 1)), "process runner")


# -- 18: a store that is down ----------------------------------------------------------------------


@case("18-s3-503-forever")
def s3_503_forever(tmp, gpt2):
    from support.fakehttp import s3_answering_503

    from zephon import Dataset
    from zephon.io import IOConfig
    from zephon.io.chunks import Shard

    server, storage = s3_answering_503(tmp)
    config = IOConfig.parse({"retries": {"attempts": 100, "backoff": 0.2, "max_wait": 1.0, "budget": 3.0}})
    error, seconds = timed(
        lambda: Dataset.from_path("s3", "s3://corpus/a.jsonl", storage_options=storage).shards(config)
    )
    opener = Dataset.from_path("s3", "s3://x/b.jsonl", storage_options=storage).opener(config)
    reading, read_seconds = timed(lambda: opener.open(Shard("s3://corpus/b.jsonl", 100, "etag")).read(10))
    server.stop()
    note = f"budget 3 s; listing timed; reading a range: {type(reading).__name__} after {read_seconds:.1f} s"
    return error, seconds, note + f"; {server.requests} requests in all"
