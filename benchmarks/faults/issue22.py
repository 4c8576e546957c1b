"""The cases of reliability issue 22, numbered as the issue numbers them (22.N), and its three
probes (22.12-22.14): a run's life, bytes that change, damaged data, weights and schedules,
impossible lane states, replay, worker processes, images, hostile text, a shared cache."""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import sys
import time

from support.corpora import rank_pipeline, write_corpus
from support.damage import edit_a_replayed_chunk, edit_in_place, numbered_pipeline, write_numbered_lines

from benchmarks.faults import (
    ROOT,
    Outcome,
    Said,
    case,
    iterate_until_error,
    last_line,
    refused_restore,
    run_process,
    state_after,
    timed,
)

# -- 1: a run's life ------------------------------------------------------------------------------

RUNNERS = ("inline", "thread", "process")


@case("22.1a-unheld-pipeline-gc", timeout=300)
def unheld_pipeline_gc(tmp, gpt2):
    folder, counts, seconds = write_corpus(os.path.join(tmp, "corpus")), [], 0.0
    for runner in RUNNERS:
        want = sum(1 for _ in iter(rank_pipeline(folder, gpt2, 1, 0, runner=runner, exhausted="stop")))
        got = []

        def collecting(runner=runner, got=got):
            # nothing but the loop holds the pipeline: a run finalized here would end it early
            for i, _ in enumerate(iter(rank_pipeline(folder, gpt2, 1, 0, runner=runner, exhausted="stop"))):
                if i in (10, 100, 400, 1000):
                    gc.collect()
                got.append(i)

        error, took = timed(collecting)
        seconds += took
        counts.append(f"{runner} {len(got)} of {want}")
        if error is not None:
            return error, seconds, "; ".join(counts)
    return None, seconds, "batches delivered with gc.collect() at 10, 100, 400, 1000: " + ", ".join(counts)


@case("22.1b-dropped-runs-churn", timeout=600)
def dropped_runs_churn(tmp, gpt2):
    from support.lifecycle import churn_runs

    folder, notes, seconds = write_corpus(os.path.join(tmp, "corpus")), [], 0.0
    for runner, rounds in (("thread", 12), ("process", 4)):
        stuck, errors, took = churn_runs(
            lambda seed, runner=runner: rank_pipeline(folder, gpt2, 1, 0, runner=runner, seed=seed), rounds
        )
        seconds += took
        notes.append(f"{runner}: 3 threads x {rounds} runs in {took:.1f} s, stuck {stuck}")
        if errors:
            return errors[0], seconds, "; ".join(notes)
    return None, seconds, "runs dropped mid-iteration while others plan and iterate: " + "; ".join(notes)


# -- 2, 3: bytes that change ----------------------------------------------------------------------


@case("22.2a-local-edit-in-place")
def local_edit_in_place(tmp, gpt2):
    path = os.path.join(tmp, "d.jsonl")
    write_numbered_lines(path)
    state = state_after(numbered_pipeline(path, gpt2), 21)
    chunk = edit_a_replayed_chunk(path, numbered_pipeline(path, gpt2), state)
    error, seconds = refused_restore(lambda: numbered_pipeline(path, gpt2), state, 40)
    lane = max(len(json.dumps(v)) for v in state["lanes"].values())
    note = f"1 MB file; a letter of chunk [{chunk.start}, {chunk.stop}) changed, size and mtime kept"
    return error, seconds, note + f"; lane state {lane} bytes; timed: new pipeline + restore + 40 batches"


def _edited_ahead(path: str, gpt2: str, url: str | None = None):
    """A chunk the run has not read yet edited in place mid-run (size and date kept), the run
    then read to its end: its error, or how many batches differ from the original bytes' run."""
    from zephon.testing import take

    source = url or path
    original = [b.digest() for b in numbered_pipeline(source, gpt2)]
    pipeline = numbered_pipeline(source, gpt2)
    got = [b.digest() for b in take(pipeline, 21)]
    plan = pipeline.spec().lane_plan()
    chunk = plan.chunk(0, 0, plan.chunks_per_lane_epoch(0) - 1)  # lane 0's last: not read yet
    edit_in_place(path, chunk.start, chunk.stop)
    error, seconds = timed(lambda: got.extend(b.digest() for b in pipeline))
    pipeline.close()
    changed = sum(a != b for a, b in zip(got, original, strict=False))
    note = f"a letter of chunk [{chunk.start}, {chunk.stop}) changed after 21 batches, before the run read it"
    if error is None:
        note += (
            f"; SILENT: the run went on, {changed} of {len(got)} batches differ from the original bytes' run"
        )
    return error, seconds, note + "; timed: the rest of the run"


@case("22.2b-local-edit-ahead-mid-run")
def local_edit_ahead(tmp, gpt2):
    path = os.path.join(tmp, "d.jsonl")
    write_numbered_lines(path)
    return _edited_ahead(path, gpt2)


def _http_replaced(tmp, gpt2, dates: bool):
    """An HTTP file without ETag (with or without Last-Modified) edited in place after a run read
    it through the cache: the restore's error; a new run's batches against the new file's."""
    from support.fakehttp import FileServer

    www = os.path.join(tmp, "www")
    os.makedirs(www)
    path = os.path.join(www, "d.jsonl")
    write_numbered_lines(path)
    server = FileServer(www).start()
    server.dates = dates
    url, cache = server.url + "/d.jsonl", {"cache": {"enabled": True, "dir": os.path.join(tmp, "cache")}}
    try:
        planned, start = numbered_pipeline(url, gpt2, io_options=cache), time.monotonic()
        planned.plan()
        planning = time.monotonic() - start
        state = state_after(planned, 21)  # the chunks it read are in the cache
        edit_a_replayed_chunk(path, numbered_pipeline(url, gpt2), state)  # size kept, date kept
        error, seconds = refused_restore(lambda: numbered_pipeline(url, gpt2, io_options=cache), state)
        served = [b.digest() for b in numbered_pipeline(url, gpt2, io_options=cache)]
        fresh = [b.digest() for b in numbered_pipeline(url, gpt2)]  # no cache: the new bytes
    finally:
        server.stop()
    stale = sum(a != b for a, b in zip(served, fresh, strict=False)) + abs(len(served) - len(fresh))
    note = (
        f"Last-Modified {'kept' if dates else 'not sent'}; planning (a full read of 1 MB) {planning:.2f} s; "
        f"a new run through the cache: {stale} of {len(fresh)} batches stale; timed: the restore"
    )
    return error, seconds, note


@case("22.3a-http-no-etag-date-kept")
def http_no_etag_date_kept(tmp, gpt2):
    return _http_replaced(tmp, gpt2, dates=True)


@case("22.3b-http-no-etag-no-date")
def http_no_etag_no_date(tmp, gpt2):
    return _http_replaced(tmp, gpt2, dates=False)


@case("22.3c-http-no-etag-edit-ahead-mid-run")
def http_edit_ahead(tmp, gpt2):
    from support.fakehttp import FileServer

    www = os.path.join(tmp, "www")
    os.makedirs(www)
    write_numbered_lines(os.path.join(www, "d.jsonl"))
    server = FileServer(www).start()
    try:
        error, seconds, note = _edited_ahead(os.path.join(www, "d.jsonl"), gpt2, server.url + "/d.jsonl")
    finally:
        server.stop()
    return error, seconds, "no ETag, Last-Modified kept; " + note


# -- 4: a WebDataset tar cut off mid-file ---------------------------------------------------------


def _cut_tar_run(tmp, gpt2, on_error: str):
    from support.damage import cut_tar, mid_member

    from zephon import Dataset, Pipeline
    from zephon.testing import drain
    from zephon.testing.images import digits

    path = cut_tar(os.path.join(tmp, "wds"), digits(12), mid_member)
    ds = Dataset.from_path("cut", path, on_error=on_error)
    p = Pipeline(ds).options(num_lanes=1, chunk_size=16).images(field="png", size=16, patch=8)
    p = p.tokenize(gpt2, field="txt", image_token=50257).pack_flat(40).batch(2)
    got = []
    error, seconds = timed(lambda: got.extend(drain(p, 50)))
    images = sum(int(b.vision.mask.sum()) for b in got) // 4  # 4 tokens per 16 x 16 image
    skipped = p.stats()["counters"].get("skipped_records", 0) if error is None else "-"
    note = f"12 samples, cut half way through sample 9's caption; on_error={on_error!r}: "
    return error, seconds, note + f"{images} images delivered, {skipped} skipped"


@case("22.4a-tar-cut-raise")
def tar_cut_raise(tmp, gpt2):
    return _cut_tar_run(tmp, gpt2, "raise")


@case("22.4b-tar-cut-skip")
def tar_cut_skip(tmp, gpt2):
    return _cut_tar_run(tmp, gpt2, "skip")


# -- 5: weights and schedules ---------------------------------------------------------------------


def _two_datasets(tmp) -> list:
    from zephon import Dataset
    from zephon.testing import synthetic_documents, write_jsonl

    return [
        Dataset.from_path(n, write_jsonl(os.path.join(tmp, f"{n}.jsonl"), synthetic_documents(200, seed=s)))
        for s, n in enumerate("ab")
    ]


def _scheduled(tmp, points: list[dict]):
    from zephon import ScheduledMixtureWorkSource

    datasets = _two_datasets(tmp)
    return timed(lambda: ScheduledMixtureWorkSource(datasets, points))


@case("22.5a-weights-1e308-static")
def weights_overflow_static(tmp, gpt2):
    from zephon import MixtureWorkSource

    datasets = _two_datasets(tmp)
    error, seconds = timed(lambda: MixtureWorkSource(datasets, {"a": 1e308, "b": 1e308}))
    return error, seconds, "MixtureWorkSource(mixture={a: 1e308, b: 1e308})"


@case("22.5b-weights-1e308-scheduled")
def weights_overflow_scheduled(tmp, gpt2):
    error, seconds = _scheduled(tmp, [{"at": 0, "weights": {"a": 1e308, "b": 1e308}}])
    return error, seconds, "ScheduledMixtureWorkSource, one point of {a: 1e308, b: 1e308}"


@case("22.5c-schedule-at-inf")
def schedule_at_inf(tmp, gpt2):
    points = [{"at": 0, "weights": {"a": 1, "b": 1}}, {"at": math.inf, "weights": {"a": 1, "b": 3}}]
    return (*_scheduled(tmp, points), "ScheduledMixtureWorkSource, point 2 at = inf")


@case("22.5d-schedule-nan")
def schedule_nan(tmp, gpt2):
    points = [{"at": 0, "weights": {"a": 1, "b": 1}}, {"at": math.nan, "weights": {"a": 1, "b": 3}}]
    return (*_scheduled(tmp, points), "ScheduledMixtureWorkSource, point 2 at = nan")


# -- 6: impossible lane states --------------------------------------------------------------------


def _impossible_lane(tmp, gpt2, change, exhausted: str = "repeat"):
    """Lane 0's state after 32 batches (4 of every lane) changed by ``change``, then restored."""
    folder = write_corpus(os.path.join(tmp, "corpus"))
    state = state_after(rank_pipeline(folder, gpt2, 1, 0, exhausted=exhausted), 32)
    change(state["lanes"]["0"])
    error, seconds = refused_restore(lambda: rank_pipeline(folder, gpt2, 1, 0, exhausted=exhausted), state)
    return error, seconds, "timed: new pipeline + restore + its first batch (lane 0's)"


@case("22.6a-lane-index-1e15")
def lane_index_huge(tmp, gpt2):
    return _impossible_lane(tmp, gpt2, lambda lane: lane.update(index=10**15))


@case("22.6b-chunk-position-1e6")
def chunk_position_huge(tmp, gpt2):
    return _impossible_lane(tmp, gpt2, lambda lane: lane["mixer"]["positions"][0].__setitem__(0, 10**6))


@case("22.6c-position-past-stopping-end")
def position_past_end(tmp, gpt2):
    def past(lane):
        lane["mixer"]["positions"][0][0] = 1000  # the corpus makes fewer chunks: past its end

    return _impossible_lane(tmp, gpt2, past, exhausted="stop")


# -- 7: replay ------------------------------------------------------------------------------------

GEOMETRY = ["--global-batch-size", "16", "--seq-len", "128", "--local-batch-size", "2"]


def _replay(*args: str) -> tuple[Said, float, list]:
    command = [sys.executable, "-m", "zephon.replay", *GEOMETRY, *args]
    return run_process(command, timeout=280, cwd=ROOT)


def _stopping_recipe(tmp, data: str | None = None) -> str:
    """The debug recipe with its data stopping (and read from ``data`` where given)."""
    from train_jobs import recipe_copy

    changes = {'exhausted = "repeat"': 'exhausted = "stop"'}
    if data is not None:
        changes[f'path = "{ROOT}/assets/debug_corpus"'] = f'path = "{data}"'
    return recipe_copy(tmp, **changes)


def _first(timeline: list, text: str) -> str:
    return next((f"{t:.2f} s" for t, line in timeline if text in line), "never")


@case("22.7a-replay-step-1e7-jsonl", timeout=300)
def replay_past_bytes(tmp, gpt2):
    from zephon.testing import synthetic_documents, write_jsonl

    data = write_jsonl(os.path.join(tmp, "d.jsonl"), synthetic_documents(300, seed=7))
    said, seconds, timeline = _replay("--recipe", _stopping_recipe(tmp, data), "--step", "10000000")
    note = "JSON lines that stop: the bytes bound the steps; "
    return said, seconds, note + f"first progress line: {_first(timeline, 'making the')}; timed: the process"


@case("22.7b-replay-step-1e7-parquet", timeout=300)
def replay_past_lane_end(tmp, gpt2):
    said, seconds, timeline = _replay("--recipe", _stopping_recipe(tmp), "--step", "10000000")
    note = f"the debug corpus (Parquet) stopping: first progress line at {_first(timeline, 'making the')}"
    return said, seconds, note + "; timed: the process, to the refusal"


@case("22.7c-replay-corrupt-checkpoint", timeout=300)
def replay_corrupt_checkpoint(tmp, gpt2):
    import warnings

    import torch.distributed.checkpoint as dcp

    folder = os.path.join(tmp, "checkpoint", "step-2")
    with warnings.catch_warnings():  # no process group: saved by this process alone
        warnings.simplefilter("ignore")
        dcp.save({"dataloader": {"dp_rank_0": b"state"}}, checkpoint_id=folder)
    with open(os.path.join(folder, ".metadata"), "wb") as f:
        f.write(b"\x80\x04 not a pickle")
    debug = os.path.join(ROOT, "zephon_recipes", "debug.toml")
    said, seconds, _ = _replay("--recipe", debug, "--step", "3", "--checkpoint", os.path.dirname(folder))
    return said, seconds, "step-2/.metadata overwritten; timed: the process"


@case("22.7d-replay-missing-checkpoint", timeout=300)
def replay_missing_checkpoint(tmp, gpt2):
    debug = os.path.join(ROOT, "zephon_recipes", "debug.toml")
    missing = os.path.join(tmp, "no-such-folder")
    said, seconds, _ = _replay("--recipe", debug, "--step", "3", "--checkpoint", missing)
    return said, seconds, "timed: the process"


@case("22.7e-replay-step-0", timeout=300)
def replay_step_zero(tmp, gpt2):
    said, seconds, _ = _replay("--recipe", os.path.join(ROOT, "zephon_recipes", "debug.toml"), "--step", "0")
    return said, seconds, "timed: the process"


# -- 8-10: worker processes -----------------------------------------------------------------------


@case("22.8-no-main-guard")
def no_main_guard(tmp, gpt2):
    from support.processes import GUARDED, UNGUARDED

    folder = write_corpus(os.path.join(tmp, "corpus"))
    runs = {}
    for name, text in (("train.py", UNGUARDED), ("guarded.py", GUARDED)):
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
        runs[name] = run_process([sys.executable, os.path.join(tmp, name), folder, gpt2])
    said, seconds, timeline = runs["train.py"]
    guarded, guarded_seconds, _ = runs["guarded.py"]
    note = f"{len(timeline)} lines of output; with the guard: {guarded.kind}, '{guarded}'"
    return said, seconds, note + f" in {guarded_seconds:.1f} s; timed: the process"


def _stopped_workers(tmp, gpt2, starting: bool):
    """Every worker of a process-runner pipeline stopped (SIGSTOP) while reading, or while the
    pool starts: the watchdog's error, timed from the SIGSTOP, worker_timeout=5."""
    from support.processes import stopped_worker_pipeline, worker_processes

    from zephon.runners.process import STARTING

    pipeline = stopped_worker_pipeline(tmp, gpt2, timeout=5)
    iterator, deadline = iter(pipeline), time.monotonic() + 60
    if starting:
        while not worker_processes() and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        executor = pipeline._run._delivery.executor
        while executor.stuck(0) is STARTING and time.monotonic() < deadline:
            next(iterator)  # until the workers have started and are reading
    workers = worker_processes()
    if not workers:
        raise Outcome("no worker process found to stop")
    for p in workers:
        p.send_signal(signal.SIGSTOP)
    try:
        error, seconds = timed(lambda: iterate_until_error(iterator))
    finally:
        for p in workers:
            p.send_signal(signal.SIGCONT)
        pipeline.close()
    return error, seconds, f"worker_timeout=5; {len(workers)} worker(s) stopped; timed from the SIGSTOP"


@case("22.10a-watchdog-stopped-reading")
def watchdog_stopped_reading(tmp, gpt2):
    return _stopped_workers(tmp, gpt2, starting=False)


@case("22.10b-watchdog-stopped-starting")
def watchdog_stopped_starting(tmp, gpt2):
    return _stopped_workers(tmp, gpt2, starting=True)


# -- 11: EXIF orientation -------------------------------------------------------------------------


@case("22.11-exif-orientation")
def exif_orientation(tmp, gpt2):
    import numpy as np
    from support.exif import STORED, jpeg, quadrants

    from zephon.ops.images import Images

    op = Images(size=32, patch=8, resize="crop")
    upright = op.patches(jpeg(quadrants()))
    jpegs = {o: jpeg(turn(quadrants()), o) for o, turn in STORED.items()}
    seen = {}
    error, seconds = timed(lambda: seen.update({o: op.patches(data) for o, data in jpegs.items()}))
    differences = {
        o: float(np.abs(p.pixels.astype(int) - upright.pixels.astype(int)).mean()) for o, p in seen.items()
    }
    upright_count = sum(d < 2 for d in differences.values())
    worst = max(differences.values(), default=math.nan)
    note = f"orientations 2-8 decoded upright: {upright_count} of {len(STORED)}"
    return error, seconds, note + f" (largest mean |diff| {worst:.2f}); timed: decoding the 7 JPEGs"


# -- probes: hostile text, a shared tiny cache, a worker killed during the hand-over -------------


@case("22.12-hostile-tokenizer-text", timeout=300)
def hostile_tokenizer_text(tmp, gpt2):
    import itertools

    import numpy as np
    from support.hostile import hostile_texts, write_hostile_jsonl

    from zephon import Dataset, Pipeline
    from zephon.io import fast_tokenizer
    from zephon.io.tokenizer import load_tokenizer

    fast_tokenizer.VERDICTS = os.path.join(tmp, "verdicts")
    tok = load_tokenizer(gpt2)
    if not tok.fast.wait():
        raise Outcome("fastokens is off: there is no second backend to compare")
    same, slowest = 0, 0.0
    for text in hostile_texts().values():
        start = time.perf_counter()
        ids, offsets = tok.fast.encode_flat([text, "after"])
        want = tok.encode_batch([text, "after"])
        slowest = max(slowest, time.perf_counter() - start)
        same += [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)] == want
    path = write_hostile_jsonl(os.path.join(tmp, "hostile.jsonl"))

    def batches(backend: str, on_error: str = "skip"):
        ds = Dataset.from_path("hostile", path, on_error=on_error)
        p = Pipeline(ds).options(num_lanes=1, runner="inline").tokenize(gpt2, backend=backend)
        p = p.pack_flat(max_length=1024).batch(microbatch_size=4)
        try:
            return np.concatenate([b.tokens for b in p]), p.stats()["counters"].get("skipped_records", 0)
        finally:
            p.close()

    (fast, skipped), (reference, _) = batches("auto"), batches("tokenizers")
    error, seconds = timed(lambda: batches("auto", on_error="raise"))
    note = (
        f"{same} of {len(hostile_texts())} texts the same ids from both backends (slowest pair "
        f"{slowest:.2f} s); skipping: batches equal {np.array_equal(fast, reference)}, {skipped} skipped; "
        "the error: on_error='raise'"
    )
    return error, seconds, note


@case("22.13-shared-tiny-cache-s3", timeout=400)
def shared_tiny_cache(tmp, gpt2):
    import subprocess

    import boto3
    from support.fakes3 import moto_s3
    from support.processes import S3_PASSES, s3_pipeline_digests

    from zephon.testing.data import kjv_records

    server, storage = moto_s3()
    data = "".join(json.dumps(r) + "\n" for r in kjv_records()[:6000]).encode()  # ~1.4 MB
    boto3.client("s3", **storage["client_kwargs"]).put_object(Bucket="corpus", Key="v.jsonl", Body=data)
    spec = {"path": "s3://corpus/v.jsonl", "storage": storage, "tokenizer": gpt2, "io": {}, "passes": 2}
    want = s3_pipeline_digests(spec)
    block, folder = 64 << 10, os.path.join(tmp, "cache")  # 3 blocks of a 22-block object
    spec["io"] = {"cache": {"enabled": True, "dir": folder, "max_bytes": 3 * block, "block_size": block}}
    command = [sys.executable, "-c", S3_PASSES, json.dumps(spec)]
    start = time.monotonic()
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    seconds = time.monotonic() - start
    server.stop()
    failed = [(p.returncode, last_line(err)) for p, (_, err) in zip(procs, outs, strict=True) if p.returncode]
    if failed:
        return Said(*failed[0]), seconds, "a process failed"
    seen = [json.loads(last_line(out)) for out, _ in outs]
    equal = all(s["runs"] == [want, want] for s in seen)
    counts = ", ".join(f"hits {s['hits']} misses {s['misses']} damaged {s['damaged']}" for s in seen)
    tmp_left = [f for _, _, fs in os.walk(folder) for f in fs if f.endswith(".tmp")]
    note = (
        f"2 processes x 2 passes equal to a run without cache: {equal}; {counts}; .tmp left {len(tmp_left)}"
    )
    return None, seconds, note + "; timed: both processes"


@case("22.14-worker-killed-during-shm-handover", timeout=300)
def worker_killed_during_handover(tmp, gpt2):
    if not os.path.isdir("/dev/shm"):
        raise Outcome("no /dev/shm")
    from support.processes import kill_a_worker, shm_files

    said, notes, seconds = None, [], 0.0
    for end in ("close", "exit"):
        folder = os.path.join(tmp, end)
        os.makedirs(folder)
        start = time.monotonic()
        pid, out, err = kill_a_worker(folder, gpt2, "writing", end)
        seconds += time.monotonic() - start
        died = next((line for line in out.splitlines() if line.startswith("error:")), None)
        if died is None:
            return Said(1, last_line(err)), seconds, f"{end}: the scenario did not run"
        kind, _, message = died.removeprefix("error: ").partition(" ")
        said = said or Said(1, message, kind=f"{kind} (in the run)")
        notes.append(f"then {end}: /dev/shm files left {len(shm_files(pid))}")
    note = "a worker SIGKILLed half way through writing a result; " + "; ".join(notes)
    return said, seconds, note + "; timed: both scenario processes (the line is what the run raised)"
