"""A user's first hour with the TorchTitan adapter: the command line's names, each recipe's own
dump folder, quiet runs, the launch check, the start-up summary and the dry run."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from zephon.torchtitan import cpu

cpu.install()  # this process builds TorchTitan configs on CPU, as the CPU training path does

from zephon.torchtitan import ZephonDataLoader  # noqa: E402
from zephon.torchtitan.job import ZephonConfigManager  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "train_configs", "llama3_debug.toml")
DEBUG = os.path.join(ROOT, "zephon_recipes", "debug.toml")


def _job(tmp_path, recipe: str = DEBUG) -> str:
    """The debug job config with an absolute recipe path (the tests run from any folder)."""
    with open(JOB) as f:
        text = f.read().replace('recipe = "zephon_recipes/debug.toml"', f'recipe = "{recipe}"')
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def _parse(tmp_path, *args: str):
    return ZephonConfigManager().parse_args(["--job.config_file", _job(tmp_path), *args])


# -- one name per setting ------------------------------------------------------------------------


def test_the_toml_names_work_on_the_command_line_as_torchtitans_do(tmp_path):
    from train_jobs import recipe_copy

    recipe = recipe_copy(str(tmp_path))
    config = _parse(tmp_path, "--data.recipe", recipe, "--job.dump_folder", str(tmp_path / "out"))
    assert config.dataloader.recipe == recipe and config.dump_folder == str(tmp_path / "out")
    config = _parse(tmp_path, "--data.num_lanes=4", "--data.skip_steps", "3-4")
    assert config.dataloader.num_lanes == 4 and config.dataloader.skip_steps == ["3-4"]


@pytest.mark.parametrize(
    ("args", "enable", "model_only"),
    [
        (["--checkpoint.enable", "false"], False, False),
        (["--checkpoint.enable=False", "--checkpoint.last_save_model_only", "true"], False, True),
        (["--checkpoint.enable", "true"], True, False),
        (["--checkpoint.no-enable"], False, False),  # TorchTitan's own flags still work
    ],
)
def test_boolean_settings_take_true_or_false_after_them(tmp_path, args, enable, model_only):
    config = _parse(tmp_path, *args)
    assert config.checkpoint.enable is enable and config.checkpoint.last_save_model_only is model_only


def test_a_data_setting_the_command_line_cannot_set_lists_those_it_can(tmp_path):
    with pytest.raises(ValueError, match=r"--data.digests: the command line sets \[data\] recipe, num_lanes"):
        _parse(tmp_path, "--data.digests", "false")


# -- each recipe its own dump folder ---------------------------------------------------------------


def test_another_recipe_on_the_command_line_gets_its_own_dump_folder(tmp_path, caplog):
    from train_jobs import recipe_copy

    ablation = recipe_copy(str(tmp_path), **{'algorithm = "wrap"': 'algorithm = "best_fit"'})
    base = "./outputs/llama3_debug"
    with caplog.at_level(logging.INFO):
        config = _parse(tmp_path, "--dataloader.recipe", ablation)
    assert config.dump_folder == os.path.join(base, "recipe")  # the recipe's file is recipe.toml
    assert config.dataloader.digest_file == os.path.join(base, "recipe", "batch_digests.jsonl")
    assert config.dataloader.plan_folder == os.path.join(base, "recipe", "zephon", "plans")
    assert "this run's outputs go to ./outputs/llama3_debug/recipe" in caplog.text
    assert _parse(tmp_path, "--data.recipe", ablation).dump_folder == os.path.join(base, "recipe")
    given = _parse(tmp_path, "--dataloader.recipe", ablation, "--dump-folder", str(tmp_path / "mine"))
    assert given.dump_folder == str(tmp_path / "mine"), "--dump_folder decides where it is given"
    assert _parse(tmp_path).dump_folder == base
    assert _parse(tmp_path, "--dataloader.recipe", DEBUG).dump_folder == base, "the job's own recipe"


def test_a_replay_with_the_ablations_recipe_finds_the_ablations_checkpoints(tmp_path):
    from train_jobs import recipe_copy

    from zephon.torchtitan import replay

    ablation = recipe_copy(str(tmp_path))
    setup = replay.from_job(_job(tmp_path), None, ["--data.recipe", ablation])
    assert setup.recipe == ablation
    assert setup.checkpoints == os.path.join("./outputs/llama3_debug", "recipe", "checkpoint")


@pytest.mark.parametrize(
    ("args", "document_mask", "most"),
    [
        (["--dataloader.document_mask", "false"], False, None),
        (["--data.max_documents_per_row", "2"], True, 2),
    ],
)
def test_a_replay_keeps_the_jobs_packing_switches_and_gives_the_rows_that_run_trained_on(
    tmp_path, args, document_mask, most
):
    from zephon.torchtitan import replay

    batches, pipeline, _ = replay.replay(replay.from_job(_job(tmp_path), None, args), 1)
    pack = pipeline.spec().lane_ops().pack
    assert (pack.document_mask, pack.max_documents_per_row) == (document_mask, most)
    starts = [(row == 0).sum() for batch in batches for row in batch.positions[:, :-1]]
    if document_mask:  # at most 2 documents a row, and some rows hold 2
        assert max(starts) == 2
    else:  # positions count the whole row: one document per row for attention
        assert all((batch.positions == np.arange(batch.positions.shape[1])).all() for batch in batches)
    pipeline.close()


def test_a_changed_recipe_on_resume_says_how_to_start_a_run_of_its_own(tmp_path):
    from train_jobs import recipe_copy

    def loader(recipe: str) -> ZephonDataLoader:
        config = ZephonDataLoader.Config(recipe=recipe, global_batch_size=16)
        return config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=64, local_batch_size=2)

    state = loader(DEBUG).state_dict()
    changed = loader(recipe_copy(str(tmp_path), **{"seed = 7": "seed = 8"}))
    with pytest.raises(ValueError, match=r"\[shuffle\] seed.* in a folder of its own \(--dump_folder"):
        changed.load_state_dict(state)


# -- quiet runs ----------------------------------------------------------------------------------


def test_a_job_without_hf_assets_is_parsed_and_built_without_torchtitans_asset_warnings(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        config = _parse(tmp_path)
        spec = config.model_spec
        spec.state_dict_adapter(spec.model, config.hf_assets_path)  # what the trainer builds
    assert config.hf_assets_path == ""
    assert "HF assets path" not in caplog.text and "model.safetensors.index.json" not in caplog.text


def test_a_job_that_sets_hf_assets_path_keeps_it_and_torchtitans_check(tmp_path, caplog):
    missing = str(tmp_path / "no-assets")
    with caplog.at_level(logging.WARNING):
        config = _parse(tmp_path, "--hf_assets_path", missing)
    assert config.hf_assets_path == missing
    assert f"HF assets path {missing} does not exist!" in caplog.text


# -- the launch check, before torchrun -------------------------------------------------------------

LAUNCH_CASES = [
    (3, []),
    (2, ["--training.global_batch_size", "12"]),
    (2, ["--dataloader.num_lanes", "3"]),
    (2, ["--data.num_lanes", "3"]),
    (1, ["--training.global_batch_size", "-1"]),
    (2, ["--training.seq_len", "64", "--dataloader.recipe", "MAX_LENGTH"]),
    (2, ["--dataloader.recipe", "GPT2"]),
    (2, ["--dataloader.skip_steps", "4-3"]),
    (2, ["--dataloader.document_mask", "false", "--data.max_documents_per_row", "2"]),
    (2, ["--data.max_documents_per_row=0"]),
    (
        4,
        [
            "--parallelism.tensor_parallel_degree",
            "4",
            "--dataloader.num_lanes",
            "3",
            "--training.global_batch_size",
            "6",
        ],
    ),
    (4, ["--parallelism.tensor-parallel-degree=2"]),
]


@pytest.mark.parametrize(("world", "args"), LAUNCH_CASES)
def test_the_launch_check_refuses_what_the_trainer_refuses_in_the_same_words(
    tmp_path, monkeypatch, gpt2, world, args
):
    from train_jobs import recipe_copy

    from zephon.torchtitan import check, jobview

    made = {
        "MAX_LENGTH": lambda: recipe_copy(str(tmp_path), **{'"wrap"': '"wrap"\nmax_length = 128'}),
        "GPT2": lambda: recipe_copy(str(tmp_path), **{f"{ROOT}/assets/tokenizers/kjv-bpe-2048": gpt2}),
    }
    args = [made[a]() if a in made else a for a in args]
    job = _job(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", str(world))
    trainer = checked = None
    try:
        ZephonConfigManager().parse_args(["--job.config_file", job, *args])
    except ValueError as e:
        trainer = str(e)
    try:
        check.check(jobview.read(job, args, cache=str(tmp_path / "cache")), world)
    except ValueError as e:
        checked = str(e)
    assert checked == trainer
    assert (trainer is None) == (world == 4), "each case but the TP ones is refused"


def test_the_launch_check_leaves_run_train_shs_help_to_the_trainer(capsys):
    from zephon.torchtitan import check

    assert check.main(["--job", JOB, "--world-size", "2", "--help"]) == 0
    assert capsys.readouterr().out == ""
    assert check.main(["--help"]) == 0 and "--world-size" in capsys.readouterr().out


def test_the_launch_check_says_what_the_job_will_be():
    from zephon.torchtitan import check, jobview

    line = check.check(jobview.read(JOB, ["--data.recipe", "zephon_recipes/debug_curriculum.toml"]), 2)
    assert "on 2 processes: DP 2, 4 of 8 lanes per rank, 1 batch of 2 rows per lane per step" in line
    assert "outputs in ./outputs/llama3_debug/debug_curriculum" in line


def test_the_launch_check_ends_the_output_with_the_error_in_under_3_cpu_seconds(tmp_path):
    import resource
    import subprocess
    import sys

    from zephon.torchtitan import jobview

    home = tmp_path / "home"
    jobview.model_facts("llama3", "llama3_debugmodel", str(home / ".cache" / "zephon" / "models"))
    probe = (
        "import sys; from zephon.torchtitan.check import main; rc = main(sys.argv[1:]); "
        "print('imported', [m for m in ('torch', 'torchtitan') if m in sys.modules]); sys.exit(rc)"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        [sys.executable, "-c", probe, "--job", JOB, "--world-size", "3"],
        capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, HOME=str(home)), timeout=120,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-2:] == [
        f"zephon: the job cannot start ({JOB}, 3 processes):",
        "  the data-parallel size is 3 but the recipe has num_lanes = 8: every rank must own the same "
        "number of lanes, so num_lanes must be a multiple of the DP size. Use a DP size among [1, 2, 4, 8], "
        "or change num_lanes (that starts a new data order)",
    ]
    assert "imported []" in result.stdout, "neither torch nor TorchTitan: the model's facts are cached"
    cpu_seconds = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert cpu_seconds < 3, cpu_seconds


def test_a_model_module_that_fails_to_import_is_named_with_its_cause_where_torch_is_too_old(tmp_path):
    """TorchTitan's message drops the cause ("Cannot import config_registry ..."); on the GPU
    machine's torch 2.11 the cause was a name torch.distributed.fsdp lacks. Simulated here by
    removing that name before TorchTitan imports, in a child process."""
    import subprocess
    import sys

    probe = (
        "import torch.distributed.fsdp as f; del f.DataParallelMeshDims; torch = __import__('torch'); "
        "torch.__version__ = '2.11.0'\n"
        "from zephon.torchtitan.jobview import read_model_facts\n"
        "try:\n    read_model_facts('llama3', 'llama3_debugmodel')\n"
        "except ValueError as e:\n    print(e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr
    message = result.stdout.strip()
    assert message.startswith("[model] module = 'llama3': Cannot import config_registry"), message
    assert (
        ". torchtitan.models.llama3.config_registry is there but does not import: ImportError: cannot "
        "import name 'DataParallelMeshDims' from 'torch.distributed.fsdp'" in message
    ), message
    assert message.endswith("(this is torch 2.11.0; TorchTitan 0.3.0 needs torch 2.13.0)"), message


def test_a_users_model_package_that_fails_to_import_is_named_with_its_cause(tmp_path, monkeypatch):
    from zephon.torchtitan.jobview import read_model_facts

    package = tmp_path / "my_models"
    package.mkdir()
    (package / "__init__.py").write_text("import a_package_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as e:
        read_model_facts("my_models", "tiny")
    assert str(e.value).endswith(
        ". my_models is there but does not import: ModuleNotFoundError: "
        "No module named 'a_package_not_installed'"
    ), e.value
    with pytest.raises(ValueError) as e:  # no such module: TorchTitan's message, the choices, alone
        read_model_facts("no_such_models", "tiny")
    assert "supported modules are: [" in str(e.value) and "is there but" not in str(e.value)


# -- what is about to happen ---------------------------------------------------------------------


def _loader_lines(caplog, world: int, rank: int, recipe: str = DEBUG, batches: int = 1) -> list[str]:
    import itertools

    config = ZephonDataLoader.Config(recipe=recipe, global_batch_size=16)
    with caplog.at_level(logging.INFO):
        loader = config.build(
            dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=64, local_batch_size=2
        )
        list(itertools.islice(iter(loader), batches))
    loader.pipeline.close()
    return [r.getMessage() for r in caplog.records if r.name == "zephon.torchtitan.summary"]


def test_the_loader_says_what_it_will_do_then_when_planning_ends_and_the_first_batch_comes(caplog):
    lines = _loader_lines(caplog, 2, 1, batches=3)
    assert lines[:5] == [
        "zephon: data recipe " + DEBUG + ": 1 dataset, weights by tokens",
        f"zephon:   kjv 100.0% (repeat) {ROOT}/assets/debug_corpus",
        f"zephon:   tokenizer {ROOT}/assets/tokenizers/kjv-bpe-2048: 2,048 tokens, EOS appended, no BOS",
        "zephon:   8 lanes, DP 2: this rank reads lanes 4-7; a step takes 1 batch of 2 rows from every lane "
        "(16 rows)",
        "zephon:   packing wrap, rows of 65 tokens; windows of 12 rows, shuffled (seed 7); runner thread, "
        "parallelism 1, prefetch 4",
    ]
    assert lines[5].startswith("zephon: planning the data")
    assert lines[6].startswith("zephon: data planned in ")
    assert lines[7].startswith("zephon: first batch delivered ") and " after the loader started (" in lines[7]
    assert len(lines) == 8, "one first batch"


def test_only_global_rank_0_gives_the_summary(caplog, monkeypatch):
    from zephon.torchtitan import summary

    monkeypatch.setattr(summary, "_global_rank", lambda: 1)
    assert _loader_lines(caplog, 2, 1) == []


def test_a_schedule_is_summarized_by_its_first_weights(caplog):
    lines = _loader_lines(caplog, 1, 0, os.path.join(ROOT, "zephon_recipes", "debug_curriculum.toml"))
    assert lines[0].endswith(": 2 datasets, weights by tokens, a schedule of 3 points (the first below)")
    assert lines[1].startswith("zephon:   early 90.0% (repeat) ") and lines[2].startswith(
        "zephon:   late 10.0%"
    )


@pytest.mark.slow  # a real torchrun job
def test_a_run_says_what_it_will_do_and_gives_no_asset_warnings(tmp_path):
    from train_jobs import run_train

    rc, log = run_train(1, str(tmp_path / "run"), "--training.steps", "1", "--checkpoint.enable", "false")
    assert rc == 0, log[-3000:]
    assert "zephon: data recipe zephon_recipes/debug.toml: 1 dataset, weights by tokens" in log
    assert "zephon:   8 lanes, DP 1: this rank reads lanes 0-7; a step takes 1 batch of 2 rows" in log
    assert "zephon: first batch delivered " in log
    assert "HF assets path" not in log and "model.safetensors.index.json" not in log
    assert "checkpoint" not in os.listdir(tmp_path / "run"), "--checkpoint.enable false"


# -- the dry run ---------------------------------------------------------------------------------


def _two_dataset_job(folder, unit: str) -> str:
    """A job on two JSON lines datasets mixed 1:3: "a" stops, "b" repeats."""
    from zephon.testing import synthetic_documents, write_jsonl

    for name, n, words in (("a", 300, (50, 150)), ("b", 600, (1, 30))):  # long documents, short ones
        os.makedirs(folder / name, exist_ok=True)
        docs = synthetic_documents(n, seed=len(name), min_words=words[0], max_words=words[1])
        write_jsonl(str(folder / name / f"{name}.jsonl"), docs)
    tables = "".join(
        f'[[datasets]]\nname = "{n}"\npath = "{n}"\nweight = {w}\nexhausted = "{e}"\n'
        for n, w, e in (("a", 1, "stop"), ("b", 3, "repeat"))
    )
    tokenizer = os.path.join(ROOT, "assets", "tokenizers", "kjv-bpe-2048")
    (folder / "r.toml").write_text(
        f'[recipe]\nnum_lanes = 4\n[tokenizer]\nid = "{tokenizer}"\n{tables}[mixture]\nunit = "{unit}"\n'
    )
    return _job(folder, str(folder / "r.toml"))


@pytest.mark.parametrize("unit", ["tokens", "documents"])
def test_the_dry_run_says_what_steps_take_of_each_dataset_and_where_a_stopping_one_runs_out(
    tmp_path, capsys, unit
):
    from zephon.torchtitan import plan

    geometry = ["--training.local_batch_size", "1", "--training.seq_len", "64"]
    job = _two_dataset_job(tmp_path, unit)
    assert plan.main(["--job", job, "--steps", "40", "--sample", "100", *geometry]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("a step is 16 rows of 65 tokens = 1,040 tokens; 40 steps = 41,600 tokens")
    rows = {line.split()[0]: line.split() for line in out[3:5]}
    config = ZephonDataLoader.Config(recipe=str(tmp_path / "r.toml"), global_batch_size=16)
    loader = config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=64, local_batch_size=1)
    batches = iter(loader)
    try:
        for _ in range(40 * 16):
            next(batches)
        taken = loader.pipeline.stats()["tokens"]  # what 40 steps took of each dataset
        steps = 40 + sum(1 for _ in batches) // 16  # every step the data holds, to its end
        total = loader.pipeline.stats()["tokens"]["a"]
    finally:
        loader.pipeline.close()
    # every chunk sampled: the estimate is exact for "a", which the run read to its end
    assert rows["a"][1] == "1" and float(rows["a"][5].replace(",", "")) == total
    for name in ("a", "b"):
        predicted = float(rows[name][7].replace(",", ""))
        assert abs(predicted - taken[name]) < 0.01 * 41_600, (name, predicted, taken)
        assert abs(float(rows[name][6].rstrip("%")) / 100 - taken[name] / 41_600) < 0.01
    assert abs(float(rows["a"][8]) - taken["a"] / total) < 0.01, "epochs of a"
    assert rows["a"][-3:-1] == ["in", "step"] and rows["b"][-2:] == ["never", "(repeats)"]
    ran_out = int(rows["a"][-1].replace(",", ""))  # the first lane ends a few documents early or late
    assert abs(ran_out - (steps + 1)) <= 2, (ran_out, steps)
    assert "DP sizes it can start and resume on: 1, 2, 4 (the divisors of num_lanes 4;" in out[-2]
    assert out[-1].startswith("first batch: planning ") and "rank 0 of 1 (runner thread)" in out[-1]


def test_the_dry_run_of_the_debug_job_and_its_zephon_command(capsys):
    import tomllib

    from zephon.torchtitan import cli

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["scripts"]["zephon"] == "zephon.torchtitan.cli:main"
    assert cli.main(["plan", "--job", JOB, "--steps", "1000", "--sample", "2"]) == 0
    out = capsys.readouterr().out
    assert "recipe zephon_recipes/debug.toml, 8 lanes; a step is 16 rows of 129 tokens" in out
    kjv = next(line.split() for line in out.splitlines() if line.startswith("kjv "))
    assert kjv[1:4] == ["4", "96", "996.2"] and kjv[7] == "2,064,000" and kjv[-2:] == ["never", "(repeats)"]
    assert 4.0 < float(kjv[8]) < 4.8, "about 470k tokens: 4.4 epochs in 1,000 steps"
    assert "DP sizes it can start and resume on: 1, 2, 4, 8 " in out
    assert cli.main(["check", "--job", JOB, "--world-size", "3"]) == 1
    assert "the data-parallel size is 3" in capsys.readouterr().err
    assert cli.main(["nothing"]) == 2


# -- the README --------------------------------------------------------------------------------------


@pytest.mark.slow  # a process pool decoding 1,797 images
def test_the_readmes_image_text_example_runs_offline_as_written(tmp_path):
    import re
    import subprocess
    import sys

    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    after = readme[readme.index("Runnable as it is, offline, on the test material") :]
    code = re.search(r"```python\n(.*?)```", after, re.S).group(1)
    said = re.search(r"It prints `(.*?)`", after, re.S).group(1).replace("\n", " ")
    (tmp_path / "example.py").write_text(code)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=ROOT)
    result = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout.strip()
    head, tail = said.split(", ..., ")
    assert printed.startswith(head) and printed.endswith(tail), (printed, said)


def test_the_readmes_links_stay_inside_the_repository_and_exist():
    import re

    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    targets = re.findall(r"\]\(([^)#\s]+)\)", readme) + re.findall(r"`(\.\./[^`]+)`", readme)
    local = [t for t in targets if "://" not in t]
    assert "docs/DESIGN.md" in local
    for target in local:
        path = os.path.normpath(os.path.join(ROOT, target))
        assert path.startswith(ROOT + os.sep) and os.path.exists(path), target


def test_the_design_imports_only_what_the_code_has():
    import re

    with open(os.path.join(ROOT, "docs", "DESIGN.md")) as f:
        design = f.read()
    imports = re.findall(r"^(from zephon[\w.]* import [\w, ]+)$", design, re.M)
    assert any("MixtureWorkSource" in line for line in imports)
    for line in imports:
        exec(line, {})


def test_run_train_from_another_folder_takes_its_paths_from_there_and_fails_fast_at_the_end(tmp_path):
    import shutil
    import subprocess

    from zephon.torchtitan import jobview

    home = tmp_path / "home"
    jobview.model_facts("llama3", "llama3_debugmodel", str(home / ".cache" / "zephon" / "models"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(os.path.join(ROOT, JOB), elsewhere / "my_job.toml")
    env = dict(os.environ, HOME=str(home), NGPU="3", CONFIG_FILE="my_job.toml")
    result = subprocess.run(
        [os.path.join(ROOT, "run_train.sh"), "--dump_folder", "runs/a"],
        capture_output=True, text=True, cwd=elsewhere, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    lines = (result.stdout + result.stderr).splitlines()
    assert lines[-2] == f"zephon: the job cannot start ({elsewhere / 'my_job.toml'}, 3 processes):"
    assert lines[-1].startswith("  the data-parallel size is 3 but the recipe has num_lanes = 8")

    # the check as run_train.sh runs it (in the repository, told the caller's folder): where the
    # outputs would go, without training
    check = subprocess.run(
        ["python", "-m", "zephon.torchtitan.check", "--job", str(elsewhere / "my_job.toml"), "--world-size",
         "2", "--dump_folder", "runs/a"],
        capture_output=True, text=True, cwd=ROOT, env=dict(env, ZEPHON_CALLER_DIR=str(elsewhere)),
        timeout=120,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip().endswith(f"outputs in {elsewhere / 'runs' / 'a'}")


def test_relative_paths_on_the_command_line_are_the_callers(tmp_path):
    from zephon.torchtitan.jobfile import caller_path, from_caller

    (tmp_path / "mine.toml").write_text("")
    args = ["--dataloader.recipe", "mine.toml", "--data.recipe=zephon_recipes/debug.toml",
            "--dump_folder", "out", "--training.steps", "3"]  # fmt: skip
    assert from_caller(args, str(tmp_path)) == [
        "--dataloader.recipe", str(tmp_path / "mine.toml"),  # found there
        "--data.recipe", "zephon_recipes/debug.toml",  # not there: the repository's
        "--dump_folder", str(tmp_path / "out"), "--training.steps", "3",
    ]  # fmt: skip
    assert from_caller(args, None) == args
    assert caller_path("/abs/out", str(tmp_path)) == "/abs/out"
