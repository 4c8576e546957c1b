"""TorchTitan with zephon, for real: torchrun processes on CPU (gloo), the llama3 debug model."""

from __future__ import annotations

import os
import shutil

import pytest
from train_jobs import by_step, default_loader_config, digest_lines, recipe_copy, run_train

from zephon.testing import logged_losses

losses = logged_losses
pytestmark = pytest.mark.slow  # real torchrun jobs


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The README's experiment: 8 steps on 2 ranks, a checkpoint every 4."""
    dump = str(tmp_path_factory.mktemp("tt") / "run")
    rc, log = run_train(2, dump, "--training.steps", "8", "--checkpoint.interval", "4")
    assert rc == 0, log[-4000:]
    lines = digest_lines(dump)
    assert [line["step"] for line in lines] == list(range(1, 9)) and len(set(by_step(lines).values())) == 8
    return dump, by_step(lines), losses(log)


def test_resume_from_step_4_on_1_and_on_4_ranks_sees_the_same_batches_and_losses(baseline):
    dump, digests, loss = baseline
    for ngpu in (1, 4):
        before = len(digest_lines(dump))
        rc, log = run_train(
            ngpu, dump, "--training.steps", "8", "--checkpoint.interval", "4", "--checkpoint.load_step", "4"
        )
        assert rc == 0, log[-4000:]
        new = digest_lines(dump)[before:]
        assert [line["dp"] for line in new] == [ngpu] * 4
        assert by_step(new) == {s: digests[s] for s in range(5, 9)}, f"resumed on {ngpu} rank(s)"
        resumed = losses(log)
        assert sorted(resumed) == [5, 6, 7, 8]
        for step, value in resumed.items():
            assert abs(value - loss[step]) <= 1e-3 * loss[step], (ngpu, step, value, loss[step])


def test_skipped_steps_train_on_the_baselines_later_data_and_resume_on_1_rank_agrees(baseline, tmp_path):
    _, digests, _ = baseline  # 8 steps without skips
    dump = str(tmp_path / "skip")
    args = ["--training.steps", "8", "--checkpoint.interval", "2", "--dataloader.skip_steps", "3-4"]
    rc, log = run_train(2, dump, *args)
    assert rc == 0, log[-4000:]
    said = "zephon: skipping the data of steps 3-4 (8 batches per rank): step 3 trains on the data of step 5 "
    assert said in log
    lines = digest_lines(dump)
    data_steps = {line["step"]: line.get("data_step", line["step"]) for line in lines}
    assert data_steps == {1: 1, 2: 2, 3: 5, 4: 6, 5: 7, 6: 8, 7: 9, 8: 10}
    skipping = by_step(lines)
    assert {s: skipping[s] for s in range(1, 7)} == {s: digests[data_steps[s]] for s in range(1, 7)}
    # per-dataset metrics at every log step (log_freq 1): 10 data steps x 16 rows x 129 tokens
    assert "zephon: step 1: data kjv 100.0% (2,064 tokens)" in log
    assert "zephon: step 8: data kjv 100.0% (20,640 tokens); skipped_steps 2" in log

    before = len(lines)  # the checkpoint of step 4 was made right after the range was applied
    rc, log = run_train(1, dump, *args, "--checkpoint.load_step", "4")
    assert rc == 0, log[-4000:]
    assert "zephon: skipping" not in log, "the checkpoint says the range was applied"
    resumed = digest_lines(dump)[before:]
    assert [line["dp"] for line in resumed] == [1] * 4
    assert [(x["step"], x["data_step"], x["digest"]) for x in resumed] == [
        (x["step"], x["data_step"], x["digest"]) for x in lines[4:]
    ]
    assert "zephon: step 8: data kjv 100.0% (20,640 tokens); skipped_steps 2" in log, "counts survive"

    # replay knows the skips: step 3 from the checkpoint of step 2 is the data of step 5
    import subprocess
    import sys

    from train_jobs import CONFIG, ROOT

    replay = [sys.executable, "-m", "zephon.torchtitan.replay"]
    cmd = [*replay, "--job", CONFIG, "--dump_folder", dump, "--step", "3"]
    result = subprocess.run(
        [*cmd, "--dataloader.skip_steps", "3-4"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"step 3: digest {skipping[3]}" in result.stdout, result.stdout[:1500]
    assert "step-2; step 3 trains on the data of step 5 of a run without skips" in result.stdout


def test_tensor_parallel_ranks_of_one_replica_get_identical_batches(baseline, tmp_path):
    _, digests, _ = baseline
    dump = str(tmp_path / "tp")
    rc, log = run_train(4, dump, "--training.steps", "3", "--parallelism.tensor_parallel_degree", "2")
    assert rc == 0, log[-4000:]
    lines = digest_lines(dump)
    assert [line["dp"] for line in lines] == [2, 2, 2], "4 processes as DP 2 x TP 2"
    assert by_step(lines) == {s: digests[s] for s in (1, 2, 3)}, "the same data as DP 2 alone"
    # TP ranks hold the same lanes: counted once, 3 steps x 16 rows x 129 tokens
    assert "zephon: step 3: data kjv 100.0% (6,192 tokens)" in log


def test_changed_recipe_on_resume_fails_naming_the_field(baseline, tmp_path):
    dump = _copy_checkpoint(baseline[0], tmp_path / "changed", 4)
    recipe = recipe_copy(str(tmp_path), **{"seed = 7": "seed = 8"})
    rc, log = run_train(
        1, dump, "--training.steps", "6", "--checkpoint.load_step", "4", "--dataloader.recipe", recipe
    )
    assert rc != 0
    assert "the data recipe changed since the checkpoint; changed: [shuffle] seed" in log
    assert "step:  5" not in log


def test_changed_runner_and_parallelism_resume_fine(baseline, tmp_path):
    source, digests, _ = baseline
    dump = _copy_checkpoint(source, tmp_path / "faster", 4)
    args = [
        "--training.steps",
        "6",
        "--checkpoint.load_step",
        "4",
        "--dataloader.runner",
        "process",
        "--dataloader.parallelism",
        "2",
    ]
    rc, log = run_train(2, dump, *args)
    assert rc == 0, log[-4000:]
    assert by_step(digest_lines(dump)) == {5: digests[5], 6: digests[6]}


def _copy_checkpoint(source: str, dump, step: int) -> str:
    os.makedirs(os.path.join(dump, "checkpoint"))
    shutil.copytree(
        os.path.join(source, "checkpoint", f"step-{step}"), os.path.join(dump, "checkpoint", f"step-{step}")
    )
    return str(dump)


def test_a_misconfigured_launch_stops_every_rank_before_step_1(tmp_path, monkeypatch):
    # every launch rule is tested in-process (test_torchtitan_config.py); this is the real path
    monkeypatch.setenv("LOG_RANK", "0,1,2")  # whichever rank torchrun hears from first
    rc, log = run_train(3, str(tmp_path / "bad"), timeout=300)
    assert "FATAL" not in log and "SIGABRT" not in log, "every rank exits cleanly, none aborts"
    assert rc != 0 and "the data-parallel size is 3 but the recipe has num_lanes = 8" in log, log[-3000:]
    assert "step:  1" not in log and "Training starts" not in log


def test_torchtitan_default_loader_cannot_resume_on_other_rank_counts(tmp_path):
    config = default_loader_config(str(tmp_path / "default_loader.toml"))
    dump = str(tmp_path / "run")
    rc, log = run_train(2, dump, "--training.steps", "4", "--checkpoint.interval", "2", config=str(config))
    assert rc == 0, log[-4000:]
    baseline = by_step(digest_lines(dump))
    resume = ["--training.steps", "4", "--checkpoint.load_step", "2"]
    rc, log = run_train(1, dump, *resume, config=str(config))
    assert rc != 0 and "dp_degree is inconsistent before and after checkpoint" in log
    rc, log = run_train(4, dump, *resume, config=str(config))
    assert rc != 0 and "Missing key in checkpoint state_dict: dataloader.dp_rank_2" in log
    before = len(digest_lines(dump))  # what users do instead: drop the loader's state
    excluded = [*resume, "--checkpoint.exclude_from_loading", "dataloader", "--dataloader.first_step", "3"]
    rc, log = run_train(1, dump, *excluded, config=str(config))
    assert rc == 0, log[-4000:]
    resumed = by_step(digest_lines(dump)[before:])
    assert sorted(resumed) == [3, 4] and all(resumed[s] != baseline[s] for s in (3, 4)), "it sees other data"


def test_replay_prints_the_digest_training_wrote_from_a_checkpoint_or_the_start(baseline, tmp_path):
    import subprocess
    import sys

    import numpy as np
    from train_jobs import CONFIG, ROOT

    dump, digests, _ = baseline
    for step, began in ((7, os.path.join("checkpoint", "step-4")), (2, "the start of the run")):
        out = str(tmp_path / f"step{step}.npz")
        cmd = [sys.executable, "-m", "zephon.torchtitan.replay", "--job", CONFIG, "--dump_folder", dump]
        result = subprocess.run(
            [*cmd, "--step", str(step), "--out", out], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"step {step}: digest {digests[step]}" in result.stdout, result.stdout[:2000]
        assert began in result.stdout
        assert np.load(out)["tokens"].shape == (8, 2, 129)


def test_a_curriculum_resumes_on_another_rank_count_with_the_same_batches(tmp_path):
    recipe = ("--dataloader.recipe", "zephon_recipes/debug_curriculum.toml")
    dump = str(tmp_path / "run")
    rc, log = run_train(2, dump, *recipe, "--training.steps", "8", "--checkpoint.interval", "4")
    assert rc == 0, log[-4000:]
    whole = by_step(digest_lines(dump))
    assert sorted(whole) == list(range(1, 9))
    rc, log = run_train(1, dump, *recipe, "--training.steps", "8", "--checkpoint.load_step", "4")
    assert rc == 0, log[-4000:]
    assert by_step(digest_lines(dump)[8:]) == {s: whole[s] for s in range(5, 9)}
