"""Scenarios around processes: worker processes to find, stop or kill, and scripts that run a
pipeline in a process of their own (a script without a main guard, a worker killed while it
hands a result over, passes over S3 through a shared cache)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import psutil

from zephon import Dataset, Pipeline
from zephon.testing import write_jsonl


def worker_processes() -> list[psutil.Process]:
    """This process's live worker processes: the fork server's children (the fork server and
    the resource tracker are this process's own children)."""
    live = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.ppid() != os.getpid():
                live.append(p)
        except psutil.Error:  # it ended meanwhile
            pass
    return live


def stopped_worker_pipeline(folder: str, gpt2: str, timeout: float) -> Pipeline:
    """A process-runner pipeline with one tokenizing worker, over 4000 documents in ``folder``
    that repeat, with ``worker_timeout=timeout``: a worker to stop (SIGSTOP) mid-run."""
    path = write_jsonl(
        os.path.join(folder, "d.jsonl"), [{"text": f"document {i} " * 40} for i in range(4000)]
    )
    ds = Dataset.from_path("d", path, exhausted="repeat")
    pipeline = Pipeline(ds).options(runner="process", worker_timeout=timeout, chunk_bytes=8 << 10)
    return pipeline.tokenize(gpt2, parallelism=1).pack_flat(64).batch(1)


# A script that iterates a process-runner pipeline: DATA TOKENIZER; "done" once it has 3 batches.
# With "main()\n" after it, its top level starts the workers; with a main guard, it does not.
MAIN_SCRIPT = """import sys
from zephon import Dataset, Pipeline
from zephon.testing import take

def main():
    pipeline = Pipeline(Dataset.from_path("d", sys.argv[1])).options(runner="process")
    take(pipeline.tokenize(sys.argv[2], parallelism=1).pack_flat(64).batch(1), 3)
    print("done")
"""
UNGUARDED = MAIN_SCRIPT + "main()\n"
GUARDED = MAIN_SCRIPT + 'if __name__ == "__main__":\n    main()\n'


# A map function in a module the workers import; in a worker it records the worker's pid, and
# with PROBE_KILL=writing the worker SIGKILLs itself half way through writing a result to /dev/shm.
PROBE_MODULE = """
import os, signal, time
OWNER = int(os.environ["PROBE_OWNER"])
if os.getpid() != OWNER and os.environ["PROBE_KILL"] == "writing":
    _write = os.pwrite
    def _dying(fd, data, offset):
        _write(fd, bytes(data[: len(data) // 2]), offset)
        os.kill(os.getpid(), signal.SIGKILL)
    os.pwrite = _dying  # a result in a file of its own
    from zephon.runners import arena
    _put = arena._write
    def _dying_put(ring, at, data):  # a result in the worker's arena
        _put(ring, at, data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    arena._write = _dying_put
def noting_worker(record):
    if os.getpid() != OWNER:
        open(os.path.join(os.environ["PROBE_PIDS"], str(os.getpid())), "w").close()
    time.sleep(0.005)
    return record
"""

KILLED_WORKER_SCRIPT = """
import glob, os, random, signal, sys, threading, time
def main():
    data, gpt2, kill, end, pids = sys.argv[1:6]
    os.environ.update(PROBE_OWNER=str(os.getpid()), PROBE_KILL=kill, PROBE_PIDS=pids)
    import zephon_probe_map
    from zephon import Dataset, Pipeline
    ds = Dataset.from_path("d", data, exhausted="repeat")
    p = Pipeline(ds).options(num_lanes=2, runner="process", chunk_bytes=1 << 18)
    p = p.map(zephon_probe_map.noting_worker, parallelism=2).tokenize(gpt2).pack_flat(1024).batch(4)
    def killer():  # a worker, at a random moment
        time.sleep(random.Random(int(kill.removeprefix("random"))).uniform(0.5, 3))
        while not os.listdir(pids):
            time.sleep(0.05)
        os.kill(int(os.listdir(pids)[0]), signal.SIGKILL)
    if kill.startswith("random"):
        threading.Thread(target=killer, daemon=True).start()
    try:
        for _ in p:
            pass
    except Exception as e:
        print("error:", type(e).__name__, e, flush=True)
    mine = glob.glob(f"/dev/shm/zephon-{os.getpid()}-*")
    print("left:", len(mine), flush=True)
    if end == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if end == "close":
        p.close()
        print("after close:", glob.glob(f"/dev/shm/zephon-{os.getpid()}-*"), flush=True)
if __name__ == "__main__":
    main()
"""


def kill_a_worker(folder: str, gpt2: str, kill: str, end: str) -> tuple[int, str, str]:
    """Run KILLED_WORKER_SCRIPT in its own process, its files in ``folder``: (its pid, what it
    printed, its stderr). ``kill``: "writing" (a worker SIGKILLs itself half way through writing
    a result to /dev/shm) or "randomN" (a worker is killed at a random moment, seed N);
    ``end``: "close" (the pipeline is closed), "exit" or "sigkill" (the process kills itself)."""
    with open(os.path.join(folder, "zephon_probe_map.py"), "w") as f:
        f.write(PROBE_MODULE)
    pids = os.path.join(folder, "pids")
    os.mkdir(pids)
    data = os.path.join(folder, "d.jsonl")
    if not os.path.exists(data):
        words = itertools.cycle(["alpha", "beta", "gamma", "delta", "epsilon"])
        write_jsonl(data, [{"text": " ".join(itertools.islice(words, 3000))} for _ in range(150)])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([folder, os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-c", KILLED_WORKER_SCRIPT, data, gpt2, kill, end, pids]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # it never ends by itself (its data repeat): not left running
        child.kill()
        child.communicate()
        raise
    return child.pid, out, err


def shm_files(pid: int) -> list[str]:
    """The shared-memory files of results that process ``pid``'s workers handed over."""
    return [f for f in os.listdir("/dev/shm") if f.startswith(f"zephon-{pid}-")]


# Passes over one S3 object through a block cache, in a process of its own: python -c S3_PASSES
# SPEC, SPEC = JSON {"path", "storage", "tokenizer", "io", "passes"}; it prints JSON {"runs": the
# batch digests of each pass, "hits", "misses", "damaged": its block cache's counters}.
S3_PASSES = """
import json, sys
from zephon import Dataset, Pipeline
from zephon.io import remote
spec = json.loads(sys.argv[1])
runs = []
for _ in range(spec["passes"]):
    ds = Dataset.from_path("d", spec["path"], storage_options=spec["storage"])
    p = Pipeline(ds).options(num_lanes=2, chunk_bytes=1 << 15, io_options=spec["io"])
    p = p.tokenize(spec["tokenizer"], parallelism=2).pack_flat(128).batch(4)
    try:
        runs.append([b.digest() for b in p])
    finally:
        p.close()
[cache] = remote._CACHES.values()
print(json.dumps({"runs": runs, "hits": cache.hits, "misses": cache.misses, "damaged": cache.damaged}))
"""


def s3_pipeline_digests(spec: dict) -> list[str]:
    """The batch digests of one pass over S3_PASSES's ``spec``, in this process."""
    from zephon.testing import drain

    ds = Dataset.from_path("d", spec["path"], storage_options=spec["storage"])
    p = Pipeline(ds).options(num_lanes=2, chunk_bytes=1 << 15, io_options=spec["io"])
    return [
        b.digest() for b in drain(p.tokenize(spec["tokenizer"], parallelism=2).pack_flat(128).batch(4), 10**6)
    ]
