"""Every benchmark script imports against the current API (a rename in zephon fails here, not in
the next person's benchmark run): each is imported as a module, its ``main`` not run. And the
script that shows a change left the data as it was (scripts/batch_digests.py) finds a change."""

from __future__ import annotations

import glob
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py")))


@pytest.mark.slow
@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_every_benchmark_imports_against_the_current_api(path):
    spec = importlib.util.spec_from_file_location(f"benchmark_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)) or os.path.basename(path) == "common.py"


@pytest.mark.slow
def test_the_batch_digests_script_finds_a_change_in_the_data(tmp_path):
    import json
    import subprocess
    import sys

    script = os.path.join(ROOT, "scripts", "batch_digests.py")
    out, data = tmp_path / "before.json", str(tmp_path / "data")
    command = [sys.executable, script, str(out), "--quick", "--only", "single_wrap_stop", "--data", data]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    before = json.loads(out.read_text())
    checks = {k: v for k, v in before["single_wrap_stop"].items() if k != "digests"}
    assert checks and all(checks.values()), "restored and threaded runs give the inline batches"
    changed = dict(before["single_wrap_stop"], digests=["0" * 16, *before["single_wrap_stop"]["digests"][1:]])
    (tmp_path / "after.json").write_text(json.dumps({"single_wrap_stop": changed}))
    itself = [sys.executable, script, "--compare", str(out), str(out)]
    same = subprocess.run(itself, capture_output=True, text=True)
    assert same.returncode == 0 and same.stdout.strip() == "the same: 1 recipes"
    differ = [sys.executable, script, "--compare", str(out), str(tmp_path / "after.json")]
    found = subprocess.run(differ, capture_output=True, text=True)
    assert found.returncode == 1 and found.stdout.strip() == "single_wrap_stop: digests changed"


@pytest.mark.parametrize(
    "script",
    [
        "throughput.py",
        "time_profile.py",
        "mixer.py",
        "lane_cost.py",
        "core_sharing.py",
        "core_scaling.py",
        "chunk_cost.py",
    ],
)
def test_a_benchmark_refuses_fewer_than_one_copy_and_says_what_to_give(script):
    import subprocess
    import sys

    path = os.path.join(ROOT, "benchmarks", script)
    run = subprocess.run([sys.executable, path, "--copies", "0"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "--copies 0: give 1 or more" in run.stderr


def test_the_core_sharing_benchmark_refuses_no_reps_and_says_what_to_give():
    import subprocess
    import sys

    path = os.path.join(ROOT, "benchmarks", "core_sharing.py")
    run = subprocess.run([sys.executable, path, "--reps", "0"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "--tokens 40000000 --reps 0: give 1 or more of each" in run.stderr


@pytest.mark.slow
def test_the_core_sharing_benchmark_times_the_encoding_alone_and_beside_python_at_each_switch_interval():
    import json
    import subprocess
    import sys

    from benchmarks.core_sharing import TURNS_INTERVALS, _turns_lines

    path = os.path.join(ROOT, "benchmarks", "core_sharing.py")
    env = dict(os.environ, FASTOKENS_BPE_THREADS="1")
    run = subprocess.run([sys.executable, path, "--child", "turns"], capture_output=True, text=True,
                         timeout=240, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads(run.stdout.strip().splitlines()[-1])
    assert record["calls"] > 100 and record["chars"] > 1_000_000  # the corpus, in calls of a chunk's size
    for key in ["alone", *map(str, TURNS_INTERVALS)]:
        wall, cpu, *pace = record[key]
        assert wall > 0 and cpu > 0 and all(p > 0 for p in pace), (key, record[key])
    lines = _turns_lines([record, record])
    assert f"| alone | {record['alone'][0]:.3f} s | 1.00x |" in "\n".join(lines)
    ratio = record["0.005"][0] / record["alone"][0]
    assert f"| beside Python, switch interval 5 ms | {record['0.005'][0]:.3f} s | {ratio:.2f}x |" in lines[-3]


def test_core_sharing_counts_the_workers_cpu_not_the_fork_servers_and_a_late_worker_from_its_start():
    """``_cpu_seconds`` takes this process and its grandchildren (the fork server's workers), not
    its children (the fork server, the resource tracker); ``_second_half`` makes rates and CPU ms
    a million tokens of the differences, a worker that appeared meanwhile counted whole."""
    import contextlib
    import signal
    import subprocess
    import sys
    import time

    from benchmarks.core_sharing import _cpu_seconds, _second_half

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)"
    parent = (
        "import subprocess, sys, time\n"
        f"c = subprocess.Popen([sys.executable, '-c', {burn!r}])\n"
        "print(c.pid, flush=True)\ntime.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        grandchild = int(child.stdout.readline())
        deadline = time.monotonic() + 30
        while (seen := _cpu_seconds()).get(grandchild, 0.0) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen.get(grandchild, 0.0) >= 0.3, seen  # the worker, with the CPU it burned
        assert child.pid not in seen and seen[0] > 0  # not the fork server; this process under 0
    finally:  # the grandchild too: killing its parent leaves it sleeping on
        if grandchild is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(grandchild, signal.SIGKILL)
        child.kill()
        child.wait()
    half = (1_000_000, 10.0, {0: 1.0, 11: 2.0})
    later = (3_000_000, 12.0, {0: 1.5, 11: 2.25, 12: 0.25})  # worker 12 started in between
    assert _second_half(half, later) == {"half_rate": 1e6, "half_own_ms": 250.0, "half_workers_ms": 250.0}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["inline", "process x2"])
def test_a_core_sharing_run_reports_its_second_half_with_its_workers_cpu(name):
    import json
    import subprocess
    import sys

    path = os.path.join(ROOT, "benchmarks", "core_sharing.py")
    # long enough for the workers to come up (a second or two here) before the run's end
    run = subprocess.run([sys.executable, path, "--child", name, "--tokens", "40000000", "--copies", "1"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads(run.stdout.strip().splitlines()[-1])
    assert record["tokens"] >= 40_000_000 and record["half_rate"] > 0 and record["half_own_ms"] > 0
    if name == "inline":
        assert record["half_workers_ms"] == 0
    else:  # two workers encode and read: most of the run's CPU, beside the rank process's lane
        assert record["half_workers_ms"] > record["half_own_ms"] > 0


def test_benchmark_runs_are_interleaved_each_said_with_the_time_left_and_a_failure_left_out_or_fatal(capsys):
    from benchmarks.common import interleaved

    calls = []

    def measure(label):
        calls.append(label)
        return None if (label, calls.count(label)) == ("b", 2) else {"rate": len(calls)}

    runs = interleaved(["a", "b"], 3, measure, lambda label, r: f"rate {r['rate']}", name=str.upper)
    assert calls == ["a", "b"] * 3  # every label's first run, then every label's second...
    assert runs == {"a": [{"rate": 1}, {"rate": 3}, {"rate": 5}], "b": [{"rate": 2}, {"rate": 6}]}
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 and lines[0].startswith("[1/6] rep 1/3, A: rate 1; about ")
    assert lines[3].startswith("[4/6] rep 2/3, B: failed; about ") and lines[-1].endswith("about 0 s left")
    with pytest.raises(SystemExit, match="bench: the run B failed \\(above\\); nothing written"):
        interleaved(
            ["a", "b"], 2, lambda label: None if label == "b" else {}, required="bench", name=str.upper
        )


def test_the_core_scaling_benchmark_measures_each_worker_count_the_cores_allow_and_projects_as_profile_md():
    from benchmarks.core_scaling import configurations, projected

    assert configurations(16) == [("inline", 1), *[("thread", w) for w in (1, 2, 4, 8, 16)],
                                  *[("process", w) for w in (1, 2, 4, 8, 15)]]  # fmt: skip
    assert configurations(2) == [("inline", 1), ("thread", 1), ("thread", 2), ("process", 1)]
    # 1e6 / max(W' / cores used, P): the workers and the rank process, at most the machine's cores
    assert projected(15, 16, p=0.0746, w=0.1896) == 1e6 / 0.0746
    assert projected(1, 16, p=0.05, w=0.2) == 1e6 / 0.1
    assert projected(8, 4, p=0.01, w=0.2) == 1e6 / 0.05


def test_the_core_scaling_benchmark_projects_from_the_figures_profile_md_holds(tmp_path):
    import re

    from benchmarks.core_scaling import PROFILE, profile_figures

    with open(PROFILE) as f:
        said = re.search(r"P = ([0-9.]+) core-s per million tokens", f.read())
    assert profile_figures()[0] == float(said[1])  # the committed profile's own process run
    other = tmp_path / "profile.md"
    other.write_text("P = 0.05 core-s per million tokens, and that of every process,\nW' = 0.2 (py-spy's)\n")
    assert profile_figures(str(other)) == (0.05, 0.2)
    other.write_text("no figures here\n")
    assert profile_figures(str(other)) is None and profile_figures(str(tmp_path / "none.md")) is None


@pytest.mark.slow
def test_the_device_check_runs_every_stage_and_says_what_each_gave_without_a_gpu(tmp_path):
    import subprocess

    out = tmp_path / "out"
    small = {"SCALING_TOKENS": "300000", "SCALING_REPS": "1"}
    env = dict(os.environ, WORK=str(tmp_path / "work"), OUT=str(out), **small)
    run = subprocess.run(["bash", os.path.join(ROOT, "scripts", "device_check.sh")], env=env,
                         capture_output=True, text=True, timeout=280)  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = (out / "summary.txt").read_text()
    assert "gpu_smoke.sh: exit 1" in summary and "no GPU here" in summary, summary  # refused, and said so
    assert "gpu_attention.py: exit 0" in summary and "GPU attention check passed" in summary, summary
    assert "TorchTitan's mask, dense on cpu: the same as every document alone" in summary
    assert "GPU attention check passed" in (out / "gpu_attention.txt").read_text()
    assert "core_scaling.py: exit 0" in summary and "| inline | 1 |" in summary, summary
    assert "| process | 1 |" in summary
    assert [p.suffix for p in sorted(out.glob("core_scaling_*"))] == [".md", ".png"]
    assert (out / "logs.tgz").stat().st_size > 0


@pytest.mark.slow
def test_the_device_check_runs_only_the_stages_asked_for(tmp_path):
    import subprocess

    out = tmp_path / "out"
    env = dict(os.environ, WORK=str(tmp_path / "work"), OUT=str(out), STAGES="smoke,attention")
    run = subprocess.run(["bash", os.path.join(ROOT, "scripts", "device_check.sh")], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = (out / "summary.txt").read_text()
    assert "STAGES: 'smoke,attention' is not a stage" in summary, summary  # commas: said, nothing run
    assert "== 1." not in summary and "== 2." not in summary and "== 3." not in summary, summary
    env["STAGES"] = "smoke"
    out.joinpath("summary.txt").unlink()
    run = subprocess.run(["bash", os.path.join(ROOT, "scripts", "device_check.sh")], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    summary = (out / "summary.txt").read_text()
    assert "== 1. GPU smoke test" in summary and "== 2." not in summary and "== 3." not in summary, summary
    assert not list(out.glob("core_scaling_*")) and not (out / "gpu_attention.txt").exists()


def test_the_profile_keeps_the_cpu_of_a_worker_process_that_ended_before_the_last_reading():
    import subprocess
    import sys
    import time

    from benchmarks.time_profile import Descendants

    others = Descendants(every=0.05)
    before = others.cpu()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(0.3)"
    child = subprocess.Popen([sys.executable, "-c", burn])
    assert others.running() >= 1
    child.wait(timeout=60)
    time.sleep(0.1)
    # summing the live processes alone gives 0 here: the child is gone
    assert others.since(before) >= 0.3
    others.stop.set()


def test_a_profiled_run_too_short_for_a_steady_part_says_so_and_what_to_give():
    import subprocess
    import sys

    path = os.path.join(ROOT, "benchmarks", "time_profile.py")
    command = [sys.executable, path, "--child", "--runner", "inline", "--workers", "1", "--tokens", "100"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "--tokens 100: no batches after the first tenth to measure; give more" in run.stderr


def test_the_profile_counts_a_class_s_methods_and_comprehensions_under_its_kind():
    import benchmarks.time_profile as profile

    delivery = "batch and delivery (counts, state)"
    consumer = "consumer (the benchmark's loop)"
    count = ["run", "_Delivery.__iter__", "Batch.tokens_per_dataset.<locals>.<listcomp>", "count_nonzero"]
    assert profile.kind_of(count) == delivery, "the delivery's own counting is not the benchmark's loop"
    assert profile.kind_of(["run", "_Iterator.__next__"]) == consumer
    assert profile.kind_of(["Thread.run", "Mixer.take", "Mixer._run_end.<locals>.takes"]).startswith("mixer")
    assert profile.kind_of(["Thread.run", "Mixer.takeover"]) == "other", "a prefix is a whole name"
    # the benchmark writing its corpus before the loader starts is neither the loader nor its consumer
    written = profile.kind_of(["<module>", "main", "run", "text_setup", "write_copies"])
    assert written.startswith("the benchmark's data written") and profile._outside(written)
    start_up = next(k for k in profile.KINDS if k.startswith("start-up"))
    assert profile._outside(start_up) and not profile._outside(consumer)


@pytest.mark.slow
def test_the_mixer_benchmark_refuses_a_run_too_short_for_one_window_and_says_what_to_give():
    import subprocess
    import sys

    path = os.path.join(ROOT, "benchmarks", "mixer.py")
    command = [sys.executable, path, "--tokens", "1000000", "--copies", "1", "--reps", "1"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "--tokens 1000000: lane 0 fetched too little" in run.stderr and "give at least" in run.stderr


def test_a_measurement_in_a_fresh_process_gives_its_last_json_line_or_none_with_the_reason(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.syspath_prepend(ROOT)
    from benchmarks.common import in_fresh_process

    script = tmp_path / "measure.py"
    script.write_text(
        "import json, sys, time\n"
        "mode = sys.argv[1]\n"
        "print('a log line'); print(json.dumps({'first': 1}))\n"
        "if mode == 'fails': raise SystemExit('the reason it failed')\n"
        "if mode == 'hangs': time.sleep(60)\n"
        "print(json.dumps({'tokens_per_s': 5.0, 'mode': mode}))\n"
    )
    assert in_fresh_process(str(script), ["ok"], "ok", timeout=60) == {"tokens_per_s": 5.0, "mode": "ok"}
    assert in_fresh_process(str(script), ["fails"], "the failing one", timeout=60) is None
    said = capsys.readouterr().out
    assert "the failing one: failed (1)" in said and "the reason it failed" in said
    assert in_fresh_process(str(script), ["hangs"], "the slow one", timeout=2) is None
    assert "the slow one: timed out after 2 s" in capsys.readouterr().out


def test_the_chunk_cost_benchmark_times_every_part_where_it_runs_and_bounds_a_lane_by_the_native_ones():
    """Each part it names is found and timed in a real run (a renamed function would leave its
    part at nothing), and the floor is the inverse of the native parts' sum."""
    import json
    import subprocess
    import sys
    from argparse import Namespace

    from benchmarks import chunk_cost

    code = "import json, benchmarks.chunk_cost as c; print(json.dumps(c.measure(400_000, 1, 1)))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    [measured] = json.loads(run.stdout.strip().splitlines()[-1])
    for label, *_ in [(chunk_cost.WHOLE,), *chunk_cost.NATIVE]:
        assert measured[label] > 0, f"{label}: not timed"
    native = sum(measured[label] for label, *_ in chunk_cost.NATIVE)
    assert native < measured[chunk_cost.WHOLE] < measured["wall"]
    # a run of 50 ms a million tokens: chunk work 30, of it native 6 x 4; the rows add up to the run
    runs = [{chunk_cost.WHOLE: 0.03, "wall": 0.05} | {label: 0.004 for label, *_ in chunk_cost.NATIVE}]
    lines = chunk_cost.report(runs, Namespace(tokens=1, reps=1, copies=1))
    table = [line.split(" | ") for line in lines if line.startswith("| ") and line[2:4] not in ("pa", "--")]
    rows = {cells[0][2:]: float(cells[1].strip("*")) for cells in table}
    assert len(chunk_cost.NATIVE) == 6
    assert rows["the rest of the chunk work: checks, fields, lengths, bookkeeping"] == 6.0
    assert rows["outside the chunk work: mixing, packing, batches, the loop"] == 20.0
    assert rows.pop("**the run**") == 50.0 and sum(rows.values()) == 50.0
    assert lines[-1].startswith("The native parts alone: 24.00 ms per M tokens")
    assert "at most 41.7M tokens/s" in lines[-1] and "it ran at 20.00M" in lines[-1]
