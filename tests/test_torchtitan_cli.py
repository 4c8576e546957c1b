"""A user's first hour with the TorchTitan adapter: the command line's names, each recipe's own
dump folder, quiet runs, the launch check, the start-up summary and the dry run."""

from __future__ import annotations

import logging
import os

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
