"""The runners' queue: most urgent work first, and work waited for before work read ahead; the
process runner's start."""

from __future__ import annotations

import errno
import os
import pickle
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.functions import SlowToStart, ThreadCounts, counting_to, sleeping_for, sleeping_then_waiting

from zephon import Dataset, Pipeline
from zephon.lanes import ChunkStreams, ReadAhead, window_needed
from zephon.runners import arena, get_runner, handover
from zephon.runners.priority import UrgentQueue
from zephon.runners.process import ProcessExecutor
from zephon.runners.thread import ThreadExecutor
from zephon.testing import take


def test_read_ahead_goes_as_deep_as_the_results_held_fit_the_budget():
    ahead = ReadAhead(lanes=8, datasets=3, parallelism=2, per_worker=get_runner("process").units_ahead)
    assert (ahead.floor, ahead.want, ahead.depth) == (1, 6, 1)  # three units in all
    for d in range(2):
        ahead.seen(d, 8 << 20)
    assert ahead.depth == 1  # not every dataset seen yet: the floor
    ahead.seen(2, 200 << 10)
    assert ahead.depth == 1  # 8 lanes x 2 chunks x 16 MiB is over 96 MiB: one ahead
    ahead = ReadAhead(lanes=8, datasets=3, parallelism=2, per_worker=get_runner("process").units_ahead)
    for d in range(3):
        ahead.seen(d, 200 << 10)  # a small dataset's chunk, tokenized
    assert ahead.depth == 6  # 8 lanes x 7 chunks x 600 KiB: 33 MiB
    for d in range(3):
        ahead.seen(d, 1 << 20)  # results of 1 MiB: 8 lanes x 4 chunks x 3 MiB = 96 MiB
    assert ahead.depth == 3
    ahead.seen(0, 100)  # smaller than seen before: the largest counts
    assert ahead.depth == 3
    inline = ReadAhead.none()
    inline.seen(0, 1)
    assert inline.depth == 0
    assert get_runner("thread").units_ahead == 4  # threads: deeper was measured slower


@settings(max_examples=200, deadline=None)
@given(
    lanes=st.integers(1, 64), datasets=st.integers(1, 6), workers=st.integers(1, 64),
    per_worker=st.integers(1, 16),
    sizes=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 64 << 20)), max_size=30),
)  # fmt: skip
def test_read_ahead_keeps_its_floor_or_fits_its_budget(lanes, datasets, workers, per_worker, sizes):
    ahead = ReadAhead(lanes, datasets, workers, per_worker)
    assert ahead.depth == ahead.floor == -(-3 // datasets)  # three units in all until results come
    for d, nbytes in sizes:
        ahead.seen(d % datasets, nbytes)
        if not all(ahead.largest):
            assert ahead.depth == ahead.floor
            continue
        assert ahead.floor <= ahead.depth <= ahead.want
        if ahead.depth > ahead.floor:  # past three units in all only within the budget
            assert lanes * (ahead.depth + 1) * sum(ahead.largest) <= ReadAhead.BUDGET


@pytest.mark.parametrize("hurried", [None, "c", "a"])
def test_a_unit_waited_for_runs_before_everything_queued(hurried):
    ran, started, gate = [], threading.Event(), threading.Event()

    def work(unit):
        if unit == "first":
            started.set()
            gate.wait(10)
        ran.append(unit)
        return unit

    executor = ThreadExecutor(work, 1)  # one unit in the pool at a time: the rest queue
    try:
        futures = {"first": executor.submit("first", (0, 0))}
        assert started.wait(10)
        for unit, priority in (("a", (1, 0)), ("b", (1, 1)), ("c", (2, 0))):
            futures[unit] = executor.submit(unit, priority)
        executor.hurry(futures["first"])  # in the pool already: nothing to move
        if hurried:
            executor.hurry(futures[hurried])
            executor.hurry(futures[hurried])  # twice: still runs once
        gate.set()
        assert {u: f.result(10) for u, f in futures.items()} == {u: u for u in futures}
    finally:
        executor.shutdown()
    queued = ["a", "b", "c"]
    if hurried:
        queued.remove(hurried)
        queued.insert(0, hurried)
    assert ran == ["first", *queued]


def test_a_chunk_read_ahead_is_asked_for_the_window_the_pace_says():
    def rows_in(window):  # windows of 8, 16, 32, then 64 rows
        return min(64, 8 << window)

    assert window_needed(3, -0.5, 0.1, rows_in) == 3  # the chunk the window stands in: now
    assert window_needed(0, 2.0, None, rows_in) == 0  # no pace yet: as if now
    # a chunk every 20 rows: 20, 40 and 60 rows from window 1's start (window 1 holds 16 rows,
    # window 2 the next 32)
    assert [window_needed(1, a, 0.05, rows_in) for a in (1, 2, 3)] == [2, 2, 3]
    assert window_needed(1, 0.5, 0.05, rows_in) == 1  # half a chunk to go: 10 rows, in window 1
    assert window_needed(4, 40, 1 / 64, rows_in) == 4 + 40  # a chunk a window of 64 rows
    assert window_needed(4, 100, 1 / 64, rows_in) == 4 + 64  # far ahead: capped
    assert window_needed(5, 3, 30 / 64, rows_in) == 5  # 30 chunks a window: three more in this one


def test_a_queued_unit_runs_in_the_order_of_its_last_priority():
    queue = UrgentQueue()
    futures = {u: queue.put(u, (k, 0)) for k, u in enumerate("abcd")}
    queue.reorder(futures["a"], (9, 0))
    queue.reorder(futures["d"], (0, 0))
    queue.hurry(futures["c"])
    queue.reorder(futures["c"], (9, 9))  # hurried: stays at the front
    with queue.ready:
        order = [queue.pop()[0] for _ in range(4)]
    assert order == ["c", "d", "b", "a"] and queue.pop() is None


def test_each_lane_s_next_chunks_go_before_any_lane_reads_further_ahead(corpus, gpt2, monkeypatch):
    """A lane's read-ahead is asked for with the window it is needed in, at the pace the lanes go
    through the dataset's chunks, so the lanes' chunks for the consumer's next windows come before
    those read ahead for later ones (the runners work on the lowest (window, lane) first)."""
    asked, before_pace, at_fetch, fetched = {}, {}, {}, {}
    needed_in, fetch = ChunkStreams._needed_in, ChunkStreams.fetch
    # a closed run's lanes thread of an earlier test may end its batch meanwhile (close never
    # waits for it): only this thread and those started here are heard
    earlier = set(threading.enumerate()) - {threading.current_thread()}

    def record_need(streams, dataset, j):
        if threading.current_thread() in earlier:
            return needed_in(streams, dataset, j)
        asked[streams.lane, j] = needed_in(streams, dataset, j)
        if not streams.pace.rows:  # no window made yet
            before_pace[streams.lane, j] = asked[streams.lane, j]
        return asked[streams.lane, j]

    def record_fetch(streams, dataset, k, skip=0):
        if threading.current_thread() not in earlier and (streams.lane, k) not in fetched:
            fetched[streams.lane, k], at_fetch[streams.lane, k] = streams.window, asked.get((streams.lane, k))
        return fetch(streams, dataset, k, skip)

    monkeypatch.setattr(ChunkStreams, "_needed_in", record_need)
    monkeypatch.setattr(ChunkStreams, "fetch", record_fetch)
    pipeline = (
        Pipeline(Dataset.from_path("synthetic", corpus, exhausted="repeat"))
        .options(num_lanes=8, chunk_bytes=512, runner="thread")
        .tokenize(gpt2, parallelism=1)
        .pack_flat(max_length=64)
        .shuffle(buffer_size=64, seed=5)  # windows of 2, 4, ... 64 rows
        .batch(microbatch_size=2)
    )
    take(pipeline, 300)
    pipeline.close()
    # copies (each made at once, under the GIL): this run's lanes thread may end its batch meanwhile
    before_pace_now, at_fetch_now, fetched_now = dict(before_pace), dict(at_fetch), dict(fetched)
    # before any window is made: each lane's first chunks, lane by lane, nearest first
    assert {(lane, j) for lane in range(8) for j in range(3)} <= set(before_pace_now)
    assert all(p == (0, lane, j) for (lane, j), p in before_pace_now.items())
    later = {key: (at_fetch_now[key][0], window) for key, window in fetched_now.items() if key[1] >= 8}
    assert len(later) > 50
    off = {key: pair for key, pair in later.items() if abs(pair[0] - pair[1]) > 1}
    assert not off, f"(lane, chunk): (window asked for, window read in): {off}"


@pytest.mark.slow  # waits on timeouts or servers by design: seconds
def test_until_a_worker_process_is_up_units_run_in_this_process():
    executor = ProcessExecutor(SlowToStart(), 2, timeout=600.0)
    try:
        first = executor.submit("a")
        second = executor.submit("b")  # the thread here is busy or done: either way it is served
        assert first.result(30) == ("a", os.getpid()), "the pool is still starting: run here"
        assert second.result(60)[0] == "b"
        deadline = time.monotonic() + 60
        while not executor.pool_up and time.monotonic() < deadline:
            time.sleep(0.05)
        unit, pid = executor.submit("c").result(60)
        assert unit == "c" and pid != os.getpid(), "once a worker is up, the work goes to the pool"
    finally:
        executor.shutdown()


@pytest.mark.slow  # waits on timeouts or servers by design: seconds
def test_a_pool_slow_to_start_gets_the_work_after_the_timeout():
    executor = ProcessExecutor(SlowToStart(), 1, timeout=1.0)
    try:
        assert executor.submit("a").result(30) == ("a", os.getpid())
        time.sleep(1.2)  # past the timeout, the worker still starting: the pool's watchdog's turn
        unit, pid = executor.submit("b").result(60)
        assert unit == "b" and pid != os.getpid()
    finally:
        executor.shutdown()


@pytest.mark.skipif("OMP_NUM_THREADS" in os.environ, reason="the worker would keep the caller's setting")
def test_a_worker_process_gives_the_tokenizers_and_torch_one_thread_each():
    """The worker count is the knob: a worker's torch (images(resizer="torch")) and tokenizers do
    not each start a thread per core."""
    executor = ProcessExecutor(ThreadCounts(), 1, timeout=600.0)
    try:
        deadline = time.monotonic() + 120
        while not executor.pool_up and time.monotonic() < deadline:
            time.sleep(0.05)
        counts = executor.submit("a").result(120)
    finally:
        executor.shutdown()
    want = {"OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1", "FASTOKENS_BPE_THREADS": "1", "torch": 1}
    assert counts == want


def test_the_fork_server_imports_what_the_work_needs_once_for_every_worker():
    from multiprocessing import forkserver

    from zephon.lanes import ChunkWork
    from zephon.ops.images import Images
    from zephon.runners.process import PRELOAD, _context

    work = ChunkWork([Images(), Images(resizer="torch"), Images(resizer="torch")], ["photos"])
    assert work.imports == ("torch",) and ChunkWork([Images()], ["photos"]).imports == ()
    before = getattr(forkserver._forkserver, "_preload_modules", None)
    try:
        _context(work.imports)
        preload = forkserver._forkserver._preload_modules
        assert set(PRELOAD) | {"torch"} <= set(preload) and len(preload) == len(set(preload))
    finally:
        forkserver._forkserver._preload_modules = before


# A script that builds rank 0 of 1's pipeline over CORPUS with GPT2 on RUNNER, warms it up, then
# prints the fork server's pid as warm_up left it (before any iteration) and 12 batches' digests.
WARM_SCRIPT = """import json, sys
from multiprocessing import forkserver
sys.path.insert(0, {tests!r})
from support.corpora import rank_pipeline
from zephon.testing import take

if __name__ == "__main__":
    corpus, gpt2, runner = sys.argv[1:4]
    pipeline = rank_pipeline(corpus, gpt2, 1, 0, runner=runner)
    assert pipeline.warm_up() is pipeline
    server = forkserver._forkserver._forkserver_pid
    digests = [batch.digest() for batch in take(pipeline, 12)]
    pipeline.close()
    print(json.dumps({{"server": server, "digests": digests}}))
"""


@pytest.mark.parametrize("runner", ["process", "thread"])
def test_warm_up_starts_the_process_runners_fork_server_at_the_build_and_changes_no_batch(
    runner, corpus, gpt2, make_rank, tmp_path
):
    """A trainer builds its loader, then its model, then iterates: warmed up at the build, the
    fork server loads meanwhile, so the first iteration's workers fork from it at once. In a
    process of its own: a fork server starts once per process. Other runners start nothing."""
    import json

    script = tmp_path / "warm.py"
    script.write_text(WARM_SCRIPT.format(tests=os.path.dirname(__file__)))
    out = subprocess.run([sys.executable, str(script), corpus, gpt2, runner], capture_output=True, text=True,
                         timeout=180)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    if runner == "process":
        assert isinstance(said["server"], int), "the fork server runs before the first iteration"
    else:
        assert said["server"] is None
    assert said["digests"] == [b.digest() for b in take(make_rank(1, 0, runner="inline"), 12)]


def test_warm_up_in_a_script_without_a_main_guard_says_what_to_add_at_that_line(tmp_path, corpus, gpt2):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\n"
        "from zephon import Dataset, Pipeline\n"
        "pipeline = Pipeline(Dataset.from_path('d', sys.argv[1])).options(runner='process')\n"
        "pipeline.tokenize(sys.argv[2], parallelism=1).pack_flat(64).batch(1).warm_up()\n"
        "print('warmed')\n"
    )
    command = [sys.executable, str(script), corpus, gpt2]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "warmed" not in out.stdout, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ValueError: runner='process': {script}, line 4 starts worker processes"), last
    assert "multiprocessing" not in out.stderr, out.stderr


def test_worker_processes_start_with_the_tokenizer_their_fork_server_loaded(gpt2, tmp_path, monkeypatch):
    """Each worker used to load its own tokenizer (0.4 s of CPU for GPT-2 with its fast backend,
    on the cores the run needs); the fork server loads it once, and the workers forked from it
    start with it, fast backend ready. In a process of its own: a fork server starts once. Hugging
    Face tokenizers alone are left to each worker (zephon.runners.preload says why)."""
    import ast
    import json

    from zephon.io import tokenizer
    from zephon.lanes import ChunkWork
    from zephon.ops import Tokenize
    from zephon.runners import preload

    both = ChunkWork([Tokenize(gpt2), Tokenize(gpt2, backend="tokenizers")], ["d"])
    assert both.tokenizers == ((gpt2, "auto"),)
    monkeypatch.setattr(tokenizer, "_LOADED", {})
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # (load_all sets it where unset)
    for name in ("FASTOKENS_BPE_THREADS", "RAYON_NUM_THREADS"):  # (it sets these too: restored after)
        monkeypatch.delenv(name, raising=False)
    assert preload.load_all(json.dumps([[gpt2, "auto"], [gpt2, "tokenizers"]])) == [(gpt2, "auto")]
    assert list(tokenizer._LOADED) == [(gpt2, "auto")], "what has no fast backend is not kept"
    # the server encodes (its probes, the warm-up) with its workers' one thread: no pool thread of
    # fastokens left in a process that forks
    assert (os.environ["FASTOKENS_BPE_THREADS"], os.environ["RAYON_NUM_THREADS"]) == ("1", "1")
    script = tmp_path / "pool.py"
    script.write_text(
        "import os, sys, time\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from support.functions import WhereTokenizerLoaded\n"
        "from zephon.runners.process import ProcessExecutor\n"
        "if __name__ == '__main__':\n"
        f"    executor = ProcessExecutor(WhereTokenizerLoaded({gpt2!r}), 2, timeout=600.0)\n"
        "    deadline = time.monotonic() + 120\n"
        "    while not executor.pool_up and time.monotonic() < deadline:\n"
        "        time.sleep(0.05)\n"
        "    answers = {executor.submit(k).result(120) for k in range(8)}\n"
        "    executor.shutdown()\n"
        "    print(os.getpid(), sorted(answers))\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    owner, answers = out.stdout.split(" ", 1)
    answers = ast.literal_eval(answers)  # [(worker pid, pid that loaded its tokenizer, backend), ...]
    workers = {worker for worker, _, _ in answers}
    servers = {loaded for _, loaded, _ in answers}
    assert int(owner) not in workers and len(servers) == 1, answers
    assert not servers & workers and int(owner) not in servers, "loaded by the fork server, once"
    assert {backend for _, _, backend in answers} == {"fastokens"}, "its fast backend ready"
    assert "forked, after parallelism" not in out.stderr, out.stderr


# A script that starts a pool of 2 workers over GPT2 in a process with no fork server yet and runs
# units in it meanwhile (each loads the tokenizer, then sleeps PAUSE s); with "held", this
# process's fastokens never gets ready. It prints when the fork server started and what held then.
DEFERRED_SCRIPT = """import json, os, sys, threading, time
sys.path.insert(0, {tests!r})
from support.functions import WhereTokenizerLoaded
from zephon.io import fast_tokenizer, tokenizer
from zephon.runners import process

if __name__ == "__main__":
    gpt2, held, imports = sys.argv[1], sys.argv[2] == "held", sys.argv[2] == "imports"
    gate = threading.Event()
    if not held:  # a first load probes: on a busy machine, longer than the second it waits by default
        process.ProcessExecutor.DEFER = 60.0
    if held:  # (and the units here say which backend is ready now, not once it is)
        real = fast_tokenizer.FastBackend._load
        fast_tokenizer.FastBackend._load = lambda self, *a: (self.building.set(), gate.wait(), real(self, *a))
        tokenizer.HFTokenizer.backend_name = property(
            lambda self: "fastokens" if self.fast.ready.is_set() else "tokenizers")
    seen = {{}}
    start = process._start_server

    def starting(tokenizers):
        fasts = [tok.fast for tok in tokenizer._LOADED.values()]
        here = getattr(globals().get("executor"), "here", None)  # (none yet: being made)
        seen.update(after=time.monotonic() - began, unit_running=here is not None,
                    ready=[fast is not None and fast.ready.is_set() for fast in fasts])
        start(tokenizers)
        seen["preload_left"] = process.PRELOAD_TOKENIZERS in os.environ

    process._start_server = starting
    began = time.monotonic()
    work = WhereTokenizerLoaded(gpt2, pause=0.05, imports=("json",) if imports else ())
    executor = process.ProcessExecutor(work, 2, timeout=600.0)
    seen["at_once"] = process._server_running()
    futures = [executor.submit(k) for k in range(120)]
    answers = [f.result(120) for f in futures]
    gate.set()
    seen["pool_up"] = executor.pool_up
    executor.shutdown()
    seen["served"] = sorted({{(pid == os.getpid(), backend) for pid, _, backend in answers}})
    print(json.dumps(seen))
"""


@pytest.mark.parametrize("case", ["free", "held", "imports"])
def test_a_pool_started_cold_starts_its_fork_server_once_this_process_s_tokenizer_is_ready(
    gpt2, tmp_path, case
):
    """Started with the pool, the fork server's imports and tokenizer loads took the cores this
    process loads its own tokenizer on and makes its first batch with. It starts once that
    tokenizer's fast backend is ready, a second at most, and between two of the units run here
    (it reads the environment it starts with, which a tokenizer reads too). In a process of its
    own: a fork server starts once per process. Where the server imports modules for the work
    (torch, a second or two), it starts with the pool, as before. Where the tokenizer is not
    ready within a second, no server is started with its names (the environment would change
    while it loads): the first worker's start starts one, and each worker loads its own."""
    import json

    script = tmp_path / "deferred.py"
    script.write_text(DEFERRED_SCRIPT.format(tests=os.path.dirname(__file__)))
    command = [sys.executable, str(script), gpt2, case]
    out = subprocess.run(command, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["at_once"] is (case == "imports"), seen
    if case == "held":  # not while a tokenizer may be running: the workers start it, and load theirs
        assert "after" not in seen, "not ready within a second: no server started with its names"
    else:
        assert seen["unit_running"] is False and seen["preload_left"] is False, seen
    if case == "free":
        assert seen["ready"] == [True], "started once this process's fast backend was ready"
    elif case == "imports":
        assert seen["ready"] == [], "started with the pool, before any unit loaded the tokenizer"
    assert seen["pool_up"], seen
    here = "tokenizers" if case == "held" else "fastokens"
    assert [False, "fastokens"] in seen["served"] and [True, here] in seen["served"], (
        "units ran here until the workers were up, then at the workers"
    )


@pytest.mark.parametrize("preset", [None, "true"])
def test_thread_workers_keep_hugging_face_tokenizers_to_one_thread_each(monkeypatch, preset):
    if preset is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", preset)
    executor = ThreadExecutor(lambda unit: unit, 2)
    try:
        assert executor.submit("a").result(10) == "a"
    finally:
        executor.shutdown()
    assert os.environ["TOKENIZERS_PARALLELISM"] == (preset or "false"), "the user's own setting stands"


def test_thread_workers_report_the_unit_held_longest_and_shutdown_cancels_the_queue_without_waiting():
    started, gate = threading.Event(), threading.Event()

    def work(unit):
        if unit == "slow":
            started.set()
            gate.wait(30)
        return unit

    executor = ThreadExecutor(work, 1)
    try:
        slow = executor.submit("slow")
        assert started.wait(10)
        queued = [executor.submit(f"q{k}") for k in range(3)]
        time.sleep(0.2)
        assert executor.stuck(0.1) == "slow", "held past the timeout: named"
        assert executor.stuck(60) is None, "not yet past this one"
        begun = time.monotonic()
        executor.shutdown()
        assert time.monotonic() - begun < 0.5, "shutdown does not wait for the unit at work"
        assert all(f.cancelled() for f in queued), "queued units are cancelled"
        assert executor.submit("late").cancelled(), "a closed executor takes nothing"
    finally:
        gate.set()
    assert slow.result(10) == "slow", "the unit at work still ends with its result"
    for thread in executor.threads:
        thread.join(10)
        assert not thread.is_alive()


def test_a_process_that_never_closes_its_thread_workers_still_exits_after_their_units_end():
    script = (
        "import sys, threading, time\n"
        "from zephon.runners.thread import ThreadExecutor\n"
        "at_work = threading.Semaphore(0)\n"
        "def work(unit):\n"
        "    at_work.release()\n"
        "    time.sleep(0.5)\n"
        "    sys.stdout.write(f'done {unit}\\n')  # one write: the two workers' lines stay whole\n"
        "    sys.stdout.flush()\n"
        "executor = ThreadExecutor(work, 2)\n"
        "futures = [executor.submit(k) for k in range(50)]\n"
        "at_work.acquire(); at_work.acquire()\n"
        "print('leaving', flush=True)\n"
    )
    begun = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "leaving" and sorted(lines[1:]) == ["done 0", "done 1"], lines
    assert time.monotonic() - begun < 30, "the queued units were not run at exit"


@pytest.mark.parametrize("seconds, most", [(0.05, 2), (0.0, 4)])
def test_a_worker_process_holds_more_units_at_once_only_while_its_units_are_quick(tmp_path, seconds, most):
    """Slow units go to a worker two at a time (an urgent one never queues behind more than one
    in its pipe); quick ones up to four (their hand-over hidden)."""
    assert (ProcessExecutor.AT_ONCE, ProcessExecutor.PER_WORKER) == (2, 4)
    executor = ProcessExecutor(sleeping_then_waiting, 1, timeout=60)
    gate = str(tmp_path / "gate")
    try:
        deadline = time.monotonic() + 60
        while not executor.pool_up and time.monotonic() < deadline:
            time.sleep(0.01)
        assert executor.pool_up
        # its pace, one unit at a time: an average that keeps a quarter of each unit, so 16 units
        # leave a slow first one (a fresh worker on a busy machine: tens of ms) at 1% of it; quick
        # units go on until their round trips average under QUICK (0.3-1.5 ms each here, but a
        # busy moment of the machine takes them past it), at most 400 of them
        for k in range(400):
            executor.submit((seconds, None)).result(60)
            pace = executor.workers[0].pace
            if k >= 15 and (seconds > 0 or pace < ProcessExecutor.QUICK):
                break
        held = [executor.submit((0.0, gate)) for _ in range(12)]  # at the worker until the gate opens
        time.sleep(0.2)
        with executor.ready:
            assert [len(w.sent) for w in executor.workers] == [most]
        open(gate, "w").close()
        assert all(f.result(60) == 0.0 for f in held)
    finally:
        open(gate, "w").close()
        executor.shutdown()


def test_a_process_executor_ends_its_workers_once_shut_down_and_takes_no_more_work():
    executor = ProcessExecutor(counting_to, 2, timeout=600.0)
    assert np.array_equal(executor.submit(10).result(60), np.arange(10))
    deadline = time.monotonic() + 60
    while len(executor.workers) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    processes = [w.process for w in executor.workers]
    executor.shutdown()
    executor.shutdown()  # twice: nothing more happens
    assert executor.submit(3).cancelled(), "a shut down executor takes nothing"
    executor.receiver.join(30)
    assert not executor.receiver.is_alive(), "the thread that read results has ended"
    assert all(p.exitcode is not None for p in processes), "every worker process has ended"


@pytest.mark.slow  # waits on timeouts by design: seconds
def test_a_unit_stuck_at_a_worker_after_shutdown_fails_within_the_timeout_and_its_worker_is_ended(caplog):
    executor = ProcessExecutor(sleeping_for, 1, timeout=1.0)
    deadline = time.monotonic() + 60
    while not executor.pool_up and time.monotonic() < deadline:
        time.sleep(0.05)
    stuck = executor.submit(600.0)
    while executor.stuck(0) is None and time.monotonic() < deadline:
        time.sleep(0.01)  # at the worker
    process = executor.workers[0].process
    begun = time.monotonic()
    executor.shutdown()
    executor.receiver.join(60)
    assert not executor.receiver.is_alive(), "the receiver does not wait for the unit forever"
    assert time.monotonic() - begun < 1.0 + 5 + 5 + 5, "the timeout, then the worker's end"
    error = stuck.exception(0)
    assert isinstance(error, TimeoutError) and "within worker_timeout (1 s) of the shutdown" in str(error)
    assert "600.0" in str(error), "the unit is named"
    assert any("did not come back" in r.getMessage() for r in caplog.records), "said in the log"
    assert process.exitcode is not None, "the stuck worker is ended"


@pytest.mark.slow  # waits on the exit's bound by design: seconds
def test_a_thread_worker_stuck_at_exit_holds_the_exit_for_the_bound_only_and_is_named():
    script = (
        "import threading, time\n"
        "from zephon.runners.thread import ThreadExecutor\n"
        "at_work = threading.Event()\n"
        "def work(unit):\n"
        "    at_work.set()\n"
        "    time.sleep(600)\n"
        "executor = ThreadExecutor(work, 2)\n"
        "executor.submit('the stuck unit')\n"
        "at_work.wait()\n"
    )
    begun = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - begun < 60, "the exit waited for the stuck unit"
    said = "at exit, 1 unit(s) still at work in this process after 5 s (the first: 'the stuck unit')"
    assert said in out.stderr


def test_a_process_leaving_while_its_start_thread_encodes_waits_for_the_unit_and_exits(tmp_path, gpt2):
    # Until a worker process is up, units run on a thread of the rank process: the interpreter's
    # exit used to stop it inside the tokenizer's native code, and the process aborted ("FATAL:
    # exception not rethrown", exit code -6; 2 of 8 runs of the first batch, then close and exit,
    # with two process workers)
    script = tmp_path / "leave.py"
    started, tokenizer_json = tmp_path / "started", os.path.join(gpt2, "tokenizer.json")
    script.write_text(
        "import os, sys, time\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from support.functions import Encoding\n"
        "from zephon.runners.process import ProcessExecutor\n"
        "if __name__ == '__main__':\n"
        f"    executor = ProcessExecutor(Encoding({tokenizer_json!r}), 1, timeout=600.0)\n"
        f"    future = executor.submit((1.5, {str(started)!r}))\n"
        f"    while not os.path.exists({str(started)!r}):\n"
        "        time.sleep(0.01)\n"
        "    print('here' if executor.here is not None else 'at a worker', flush=True)\n"
    )
    for _ in range(2):
        started.unlink(missing_ok=True)
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert out.stdout == "here\n", "the unit ran on the start thread"
        assert out.returncode == 0 and "FATAL" not in out.stderr, (out.returncode, out.stderr[-2000:])


def test_large_results_come_back_through_shared_memory_and_leave_nothing_there(tmp_path):
    executor = ProcessExecutor(counting_to, 2, timeout=600.0, shared_memory=str(tmp_path))
    try:
        deadline = time.monotonic() + 60
        while not executor.pool_up and time.monotonic() < deadline:
            time.sleep(0.05)  # the first units would run in this process
        # 2 MB or so each: round each worker's arena (8 MiB, sized by its first large result) 5 times
        sizes = [10, 100_000, 300_000, 100_000] + [250_000 + 997 * k for k in range(40)]
        futures = [(n, executor.submit(n)) for n in sizes]
        for n, future in futures:
            out = future.result(60)
            assert np.array_equal(out, np.arange(n)) and out.flags.writeable
            # large: a view of the buffer copied out of shared memory; small: of the bytes from the pipe
            assert isinstance(out.base, np.ndarray) == (n >= 100_000), type(out.base)
        assert all(arena.read_of(w.arena) > 0 for w in executor.workers), "each worker's arena was used"
    finally:
        executor.shutdown()
    assert list(tmp_path.iterdir()) == [], "every file is removed once read"


def test_without_room_in_shared_memory_a_result_goes_through_the_pipe(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    result = {"ids": np.arange(50_000), "name": "chunk"}
    shipped = handover.ship(result, handover.prefix(str(tmp_path)))
    assert shipped is result and list(tmp_path.iterdir()) == []


def test_a_shipped_result_is_read_once_and_its_file_removed(tmp_path):
    result = {"ids": np.arange(50_000, dtype=np.int32), "patches": np.ones((7, 768), np.uint8), "n": 3}
    shipped = handover.ship(result, handover.prefix(str(tmp_path)))
    assert shipped is not result and len(list(tmp_path.iterdir())) == 1
    back = pickle.loads(pickle.dumps(shipped))
    assert back["n"] == 3 and list(tmp_path.iterdir()) == []
    for key in ("ids", "patches"):
        assert back[key].dtype == result[key].dtype and np.array_equal(back[key], result[key])
        assert back[key].ctypes.data % 64 == 0
    assert handover.ship(result, None) is result, "no shared memory: as it is"
    handover.ship(result, handover.prefix(str(tmp_path)))  # never received (its reader died)
    handover.remove_all(handover.prefix(str(tmp_path)))
    assert len(list(tmp_path.iterdir())) == 1, "another pool's files stay"
    handover.remove_all(str(next(tmp_path.iterdir()))[:-32])
    assert list(tmp_path.iterdir()) == []


def test_an_arena_carries_results_round_and_round_and_never_over_what_was_not_read(tmp_path):
    # the worker's side and the owner's, in one process: put, copy out, say how far it was read
    prefix = handover.prefix(str(tmp_path))
    ring = arena.Arena(prefix + "arena-1")
    results = [{"ids": np.arange(k, k + 100_000, dtype=np.int64), "k": k} for k in range(60)]
    shipped = [handover.ship(results[0], prefix, ring)]
    name = os.path.basename(ring.path)
    assert ring.size == arena.SMALLEST and [p.name for p in tmp_path.iterdir()] == [name]
    # 800 kB each in 8 MiB: ten fit, the eleventh does not while none was read
    shipped += [handover.ship(r, prefix, ring) for r in results[1:11]]
    assert [type(s).__name__ for s in shipped] == ["_InArena"] * 10 + ["_Shipment"]
    back = [pickle.loads(pickle.dumps(s)) for s in shipped]  # the owner copies them out, in order
    assert not (tmp_path / name).exists(), "removed once the owner mapped it"
    for got, want in zip(back, results, strict=False):
        assert got["k"] == want["k"] and np.array_equal(got["ids"], want["ids"])
        assert got["ids"].flags.writeable and got["ids"].ctypes.data % 64 == 0
    ring.heard(arena.read_of(ring.path))  # said with the next unit: the ring is free again
    for r in results[11:]:  # round the ring several times, each read before the next is put
        got = pickle.loads(pickle.dumps(handover.ship(r, prefix, ring)))
        ring.heard(arena.read_of(ring.path))
        assert np.array_equal(got["ids"], r["ids"])
    assert ring.written > 4 * ring.size
    kept = pickle.loads(pickle.dumps(handover.ship(results[0], prefix, ring)))
    for r in results[1:12]:  # put after it, not read: what the owner holds is its own copy
        handover.ship(r, prefix, ring)
    assert np.array_equal(kept["ids"], results[0]["ids"])
    handover.remove_all(prefix)
    assert arena.read_of(ring.path) == 0 and list(tmp_path.iterdir()) == []


def test_a_worker_without_room_for_an_arena_ships_each_result_in_a_file(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    prefix = handover.prefix(str(tmp_path))
    ring = arena.Arena(prefix + "arena-1")
    monkeypatch.setattr(os, "posix_fallocate", full)
    result = {"ids": np.arange(50_000)}
    assert handover.ship(result, prefix, ring) is result and ring.size == -1
    monkeypatch.undo()
    assert type(handover.ship(result, prefix, ring)).__name__ == "_Shipment", "no arena again: a file"
    handover.remove_all(prefix)
    assert list(tmp_path.iterdir()) == []


def test_an_arena_takes_a_quarter_of_the_room_free_and_none_where_that_is_too_small(tmp_path, monkeypatch):
    result = {"ids": np.arange(100_000)}  # 800 kB: an arena of 8 MiB where there is room
    for free, size in ((64 << 20, 8 << 20), (20 << 20, 5 << 20), (4 << 20, -1)):
        room = SimpleNamespace(f_bavail=free, f_frsize=1)
        monkeypatch.setattr(os, "statvfs", lambda folder, room=room: room)
        prefix = handover.prefix(str(tmp_path))
        ring = arena.Arena(prefix + "arena-1")
        shipped = handover.ship(result, prefix, ring)
        assert ring.size == size, free
        assert type(shipped).__name__ == ("_InArena" if size > 0 else "_Shipment")
        assert np.array_equal(pickle.loads(pickle.dumps(shipped))["ids"], result["ids"])
        handover.remove_all(prefix)
    assert list(tmp_path.iterdir()) == []


def test_results_never_received_are_removed_when_the_owner_exits(tmp_path):
    # a worker's result sent as the owner exits: its pools' manager threads read no more
    script = (
        "import sys, numpy as np\n"
        "from zephon.runners import handover\n"
        "handover.ship({'ids': np.arange(100_000)}, handover.prefix(sys.argv[1]))\n"
        "assert len(__import__('os').listdir(sys.argv[1])) == 1\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=120)
    assert list(tmp_path.iterdir()) == []


def test_a_new_pool_removes_old_files_of_owners_that_are_gone_and_nothing_else(tmp_path):
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead, past = int(gone.stdout), time.time() - 24 * 3600
    files = {
        "old, owner gone": (f"zephon-{dead}-0123456789ab-x", past),
        "young, owner gone": (f"zephon-{dead}-0123456789ab-y", time.time()),
        "old, owner alive": (f"zephon-{os.getpid()}-0123456789ab-z", past),
        "not ours": (f"torch-{dead}-w", past),
    }
    for name, when in files.values():
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (when, when))
    handover.remove_all(handover.prefix(str(tmp_path)))
    left = {what for what, (name, _) in files.items() if (tmp_path / name).exists()}
    assert left == {"young, owner gone", "old, owner alive", "not ours"}
