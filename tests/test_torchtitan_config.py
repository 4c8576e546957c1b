"""The TorchTitan adapter in-process: recipes, job configs and the loader's state, without torchrun."""

from __future__ import annotations

import glob
import itertools
import os

import pytest

import zephon.torchtitan  # noqa: F401 - before torchtitan: CPU support
from zephon.torchtitan import ZephonDataLoader, load_recipe
from zephon.torchtitan.job import ZephonConfigManager, read_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEBUG = os.path.join(ROOT, "zephon_recipes", "debug.toml")


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "zephon_recipes", "*.toml"))))
def test_every_shipped_recipe_is_valid(path):
    recipe = load_recipe(path)
    assert recipe.datasets and recipe.tokenizer_id


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "train_configs", "*.toml"))))
def test_every_shipped_job_config_is_valid(path):
    job = read_job(path)
    assert os.path.exists(os.path.join(ROOT, job["data"]["recipe"]))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[recipes]\nseed = 1\n", r"unknown section\(s\) \['recipes'\]; valid: \['recipe', 'tokenizer'"),
        ("[recipe]\nlanes = 8\n", r"unknown key 'lanes' in \[recipe\]; valid keys: \['chunk_bytes'"),
        ("[recipe]\nnum_lanes = '8'\n", r"num_lanes = '8' should be a int"),
        ("[tokenizer]\nid = 'x'\n", r"add at least one \[\[datasets\]\] table"),
        ("[tokenizer]\nid = 'x'\n[[datasets]]\nname = 'a'\n", r"\[\[datasets\]\] #1 needs 'path'"),
        (
            "[tokenizer]\nid = 'x'\n[[datasets]]\nname = 'a'\npath = 'p'\nwieght = 2\n",
            r"unknown key 'wieght'",
        ),
        ("[[datasets]]\nname = 'a'\npath = 'p'\n", r"\[tokenizer\] needs id"),
    ],
)
def test_bad_recipes_are_explained(tmp_path, text, message):
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_recipe(str(path))


def _job(tmp_path, extra: str) -> str:
    with open(os.path.join(ROOT, "train_configs", "llama3_debug.toml")) as f:
        text = f.read().replace('recipe = "zephon_recipes/debug.toml"', f'recipe = "{DEBUG}"')
    path = tmp_path / "job.toml"
    path.write_text(text + extra)
    return str(path)


def test_job_config_sections_apply_and_the_command_line_wins(tmp_path):
    config = ZephonConfigManager().parse_args(
        ["--job.config_file", _job(tmp_path, ""), "--training.steps", "3"]
    )
    assert config.training.steps == 3 and config.training.seq_len == 128
    assert config.checkpoint.interval == 5 and config.dump_folder == "./outputs/llama3_debug"
    assert isinstance(config.dataloader, ZephonDataLoader.Config)
    assert config.dataloader.global_batch_size == 16
    assert config.dataloader.digest_file == os.path.join("./outputs/llama3_debug", "batch_digests.jsonl")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("[trainig]\nsteps = 1\n", r"unknown section \[trainig\]; valid sections: \[.*'training'"),
        ("[training]\nstpes = 1\n", r"unknown key 'stpes' in \[training\]; valid keys: \[.*'steps'"),
        ("[training]\nmax_norm = 'big'\n", r"\[training\] max_norm = 'big' should be like 1.0"),
        ("[job]\ndumpfolder = 'x'\n", r"unknown key 'dumpfolder' in \[job\]"),
    ],
)
def test_bad_job_configs_list_what_is_valid(tmp_path, extra, message):
    text = _job(tmp_path, "")
    with open(text) as f:
        body = f.read()
    # TOML forbids a section twice: merge the extra keys into the existing table instead
    section = extra.split("\n", 1)[0]
    if section in body:
        body = body.replace(section + "\n", extra, 1)
    else:
        body += extra
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(ValueError, match=message):
        ZephonConfigManager().parse_args(["--job.config_file", str(path)])


def _loader(world: int, rank: int, **config) -> ZephonDataLoader:
    cfg = ZephonDataLoader.Config(recipe=DEBUG, global_batch_size=16, **config)
    return cfg.build(dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=64, local_batch_size=2)


def test_batches_are_torchtitan_shaped_with_positions_and_ignored_padding():
    loader = _loader(2, 0)
    (inputs, labels), *_ = itertools.islice(iter(loader), 3)
    assert set(inputs) == {"input", "positions"}
    assert inputs["input"].shape == labels.shape == inputs["positions"].shape == (2, 64)
    assert str(inputs["input"].dtype) == "torch.int64" and str(labels.dtype) == "torch.int64"
    assert (labels[:, :-1] == inputs["input"][:, 1:]).all()


def test_lane_state_saved_on_2_ranks_loads_on_4_in_process():
    states, batches = [], []
    for rank in range(2):
        loader = _loader(2, rank)
        iterator = iter(loader)
        batches += [next(iterator)[1] for _ in range(8)]  # two steps: 4 lanes x 1 batch each
        states.append(loader.state_dict())
    assert sorted(states[0]) == ["lane_00000", "lane_00001", "lane_00002", "lane_00003", "meta"]
    merged = {**states[0], **states[1]}
    reference = list(itertools.islice((b[1] for b in iter(_loader(1, 0))), 8 * 3))
    resumed = []
    for rank in range(4):
        loader = _loader(4, rank)
        template = loader.state_dict()  # what DCP asks for: this rank's lanes only
        loader.load_state_dict({k: merged[k] for k in template})
        resumed += [b[1] for b in itertools.islice(iter(loader), 2)]
    # every lane's third batch (index 2), as the 1-rank run delivers them (round-robin over 8 lanes)
    want = reference[16:24]
    assert sorted(x.numpy().tobytes() for x in resumed) == sorted(x.numpy().tobytes() for x in want)


def test_a_checkpoint_of_another_global_batch_size_is_refused():
    state = _loader(1, 0).state_dict()
    other = ZephonDataLoader.Config(recipe=DEBUG, global_batch_size=32).build(
        dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=64, local_batch_size=2
    )
    with pytest.raises(
        ValueError, match=r"training.global_batch_size was 16 when the checkpoint was made and is 32"
    ):
        other.load_state_dict(state)


def test_recipe_dataset_paths_and_globs_are_relative_to_the_recipe(tmp_path):
    (tmp_path / "recipes").mkdir()
    path = tmp_path / "recipes" / "r.toml"
    path.write_text("[tokenizer]\nid = 'org/tok'\n[[datasets]]\nname = 'a'\npath = '../data/*.jsonl'\n")
    recipe = load_recipe(str(path))
    assert recipe.resolve("../data/*.jsonl") == str(tmp_path / "data" / "*.jsonl")
    assert recipe.resolve("s3://bucket/x.parquet") == "s3://bucket/x.parquet"
    assert recipe.tokenizer_id == "org/tok", "an id that is no file next to the recipe is a hub id"
