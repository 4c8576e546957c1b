"""The TorchTitan adapter in-process: recipes, job configs and the loader's state, without torchrun."""

from __future__ import annotations

import glob
import itertools
import os

import pytest

from zephon.torchtitan import cpu

cpu.install()  # this process builds TorchTitan configs on CPU, as the CPU training path does

from zephon.torchtitan import ZephonDataLoader, load_recipe  # noqa: E402
from zephon.torchtitan.job import ZephonConfigManager, read_job  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEBUG = os.path.join(ROOT, "zephon_recipes", "debug.toml")


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "zephon_recipes", "*.toml"))))
def test_every_shipped_recipe_builds_its_pipeline_and_the_local_ones_deliver(path, gpt2):
    from zephon.torchtitan.recipe import build_pipeline

    recipe = load_recipe(path)
    local = os.path.exists(recipe.tokenizer_id) and all("://" not in d.path for d in recipe.datasets)
    if not local:  # a hub tokenizer and hub data: everything but their download is checked here
        recipe = load_recipe(path, {"tokenizer": {"id": gpt2}})
    seq_len = recipe.max_length or 2048
    pipeline = build_pipeline(recipe, dp_rank=0, dp_world_size=1, seq_len=seq_len, microbatch_size=2)
    spec = pipeline.spec()
    assert spec.lane_ops().pack.max_length == seq_len and spec.window_rows() % 2 == 0
    assert spec.options.num_lanes == recipe.num_lanes
    if local:
        batch = next(iter(pipeline))
        assert batch.tokens.shape == (2, seq_len + 1)
        pipeline.close()


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "train_configs", "*.toml"))))
def test_every_shipped_job_config_is_valid(path):
    job = read_job(path)
    assert os.path.exists(os.path.join(ROOT, job["data"]["recipe"]))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[recipes]\nseed = 1\n", r"unknown section\(s\) \['recipes'\]; valid: \['recipe', 'tokenizer'"),
        ("[recipe]\nlanes = 8\n", r"\[recipe\]: unknown key 'lanes'; valid keys: \['chunk_bytes'"),
        ("[recipe]\nnum_lanes = '8'\n", r"\[recipe\]: num_lanes = '8' should be an int"),
        ("[recipe]\nflush_every = 4\n", r"\[recipe\]: unknown key 'flush_every'; valid keys: .*window_rows"),
        ("[packing]\nalgorithm = 1\n", r"\[packing\]: algorithm = 1 should be a string"),
        ("[packing]\ndocument_mask = 1\n", r"\[packing\]: document_mask = 1 should be true or false"),
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
        ("[training]\nstpes = 1\n", r"\[training\]: unknown key 'stpes'; valid keys: \[.*'steps'"),
        ("[training]\nmax_norm = 'big'\n", r"\[training\]: max_norm = 'big' should be a number"),
        ("[training]\ngc_freq = 2.5\n", r"\[training\]: gc_freq = 2.5 should be an int"),
        ("[training]\ndtype = 'fp8'\n", r"\[training\]: dtype = 'fp8' should be 'bfloat16' or 'float32'"),
        ("[job]\ndumpfolder = 'x'\n", r"\[job\]: unknown key 'dumpfolder'"),
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


@pytest.mark.slow  # three fresh interpreters import torch and torchtitan
def test_importing_the_adapter_changes_nothing_in_torch_or_torchtitan():
    import subprocess
    import sys

    probe = (
        "import torch.distributed as dist, torchtitan.tools.utils as u, torchtitan.distributed.fsdp as f; "
        "print(u.device_type, hasattr(dist, 'set_timeout'), f.disable_fsdp_gradient_division.__module__)"
    )
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    adapter = "import zephon.torchtitan; from zephon.torchtitan import ZephonDataLoader, load_recipe; "
    after = subprocess.run(
        [sys.executable, "-c", adapter + probe], capture_output=True, text=True, check=True
    )
    assert after.stdout == plain.stdout and plain.stdout.strip()
    installed = "from zephon.torchtitan import cpu; cpu.install(); " + probe
    cpu_path = subprocess.run([sys.executable, "-c", installed], capture_output=True, text=True, check=True)
    assert cpu_path.stdout.split() == ["cpu", "True", "zephon.torchtitan.cpu"], "the CPU path does install"


@pytest.mark.parametrize(
    ("world", "args", "message"),
    [
        (3, [], r"the data-parallel size is 3 but the recipe has num_lanes = 8"),
        (
            2,
            ["--training.global_batch_size", "12"],
            r"global_batch_size = 12 does not split evenly across num_lanes 8 x "
            r"training.local_batch_size 2 = 16",
        ),
        (2, ["--dataloader.num_lanes", "3"], r"the data-parallel size is 2 but the recipe has num_lanes = 3"),
        (1, ["--training.global_batch_size", "-1"], r"set training.global_batch_size"),
        (4, ["--parallelism.tensor_parallel_degree", "4", "--dataloader.num_lanes", "3"], None),
    ],
    ids=["dp-does-not-divide-lanes", "global-batch", "lanes-override", "no-global-batch", "tp-leaves-dp-1"],
)
def test_launch_checks_name_the_numbers_to_change(tmp_path, monkeypatch, world, args, message):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    parse = ZephonConfigManager().parse_args
    if message is None:  # 4 ranks of one TP group form DP 1, which any num_lanes allows
        parse(["--job.config_file", _job(tmp_path, ""), *args, "--training.global_batch_size", "6"])
        return
    with pytest.raises(ValueError, match=message):
        parse(["--job.config_file", _job(tmp_path, ""), *args])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("gpt2", r"has 50257 tokens but the model's vocabulary has 2048"),
        ("max_length", r"\[packing\] max_length = 256 but training.seq_len = 128"),
    ],
)
def test_a_recipe_that_does_not_fit_the_model_fails_at_launch(tmp_path, gpt2, change, message):
    from train_jobs import recipe_copy

    if change == "gpt2":
        recipe = recipe_copy(
            str(tmp_path), **{f'id = "{ROOT}/assets/tokenizers/kjv-bpe-2048"': f'id = "{gpt2}"'}
        )
    else:
        recipe = recipe_copy(str(tmp_path), **{'algorithm = "wrap"': 'algorithm = "wrap"\nmax_length = 256'})
    with pytest.raises(ValueError, match=message):
        ZephonConfigManager().parse_args(
            ["--job.config_file", _job(tmp_path, ""), "--dataloader.recipe", recipe]
        )


@pytest.mark.parametrize(
    ("args", "document_mask", "most", "balance"),
    [
        ([], True, None, False),
        (["--dataloader.document_mask", "False"], False, None, False),
        (["--dataloader.max_documents_per_row", "4"], True, 4, False),
        (["--dataloader.balance_attention", "True"], True, None, True),
    ],
)
def test_document_masking_is_on_by_default_and_the_command_line_switches_it(
    tmp_path, args, document_mask, most, balance
):
    config = ZephonConfigManager().parse_args(["--job.config_file", _job(tmp_path, ""), *args])
    loader = ZephonDataLoader(config.dataloader, dp_world_size=8, dp_rank=0, seq_len=128, local_batch_size=2)
    ops = loader.pipeline.spec().lane_ops()
    assert (ops.pack.document_mask, ops.pack.max_documents_per_row) == (document_mask, most)
    assert ops.batch.balance_attention == balance
    positions = next(iter(loader))[0]["positions"]
    assert ((positions == 0).sum(dim=1) > 1).any() == document_mask
    loader.pipeline.close()


def test_a_model_whose_attention_cannot_mask_documents_is_refused_naming_the_switch():
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry

    from zephon.torchtitan.checks import attention_kinds, check_attention

    for backend in ("flex", "varlen"):
        check_attention(attention_kinds(model_registry("debugmodel", attn_backend=backend).model), True)
    model = model_registry("debugmodel").model
    model.layers[3].attention.inner_attention = ScaledDotProductAttention.Config()
    with pytest.raises(
        ValueError, match=r"layers.3.attention uses ScaledDotProductAttention.*document_mask = false"
    ):
        check_attention(attention_kinds(model), True)
    check_attention(attention_kinds(model), False)


def test_a_packing_rule_that_cannot_hold_fails_at_launch_naming_it(tmp_path):
    from train_jobs import recipe_copy

    recipe = recipe_copy(
        str(tmp_path), **{'algorithm = "wrap"': 'algorithm = "wrap"\nmax_documents_per_row = 0'}
    )
    with pytest.raises(ValueError, match=r"\[packing\] pack_flat\(max_documents_per_row=0\)"):
        ZephonConfigManager().parse_args(
            ["--job.config_file", _job(tmp_path, ""), "--dataloader.recipe", recipe]
        )


def test_a_recipe_sets_on_error_per_dataset_and_a_wrong_value_is_named(tmp_path):
    from train_jobs import recipe_copy

    from zephon.torchtitan.recipe import build_pipeline

    geometry = dict(dp_rank=0, dp_world_size=1, seq_len=64, microbatch_size=2)
    line = 'exhausted = "repeat"'
    skipping = recipe_copy(str(tmp_path), **{line: line + '\non_error = "skip"'})
    pipeline = build_pipeline(load_recipe(skipping), **geometry)
    assert [d.on_error for d in pipeline.source.datasets] == ["skip"]
    wrong = recipe_copy(str(tmp_path), **{line: line + '\non_error = "warn"'})
    with pytest.raises(ValueError, match=r"'kjv': on_error='warn', expected one of \('raise', 'skip'\)"):
        build_pipeline(load_recipe(wrong), **geometry)


def test_a_recipes_io_section_reaches_the_run_and_planning_reads_with_that_many_threads(tmp_path):
    from support.inflight import InFlight
    from train_jobs import recipe_copy

    from zephon.runners import planning_map
    from zephon.torchtitan.recipe import build_pipeline

    line = 'exhausted = "repeat"'
    recipe = recipe_copy(str(tmp_path), **{line: line + "\n\n[io]\nmax_requests = 3"})
    pipeline = build_pipeline(load_recipe(recipe), dp_rank=0, dp_world_size=1, seq_len=64, microbatch_size=2)
    assert pipeline.opts.io.max_requests == 3
    counter = InFlight()
    planning_map(pipeline.opts.io)(lambda _: counter.hold(), range(24))
    assert counter.most == 3


def test_replay_of_a_step_from_the_recipe_matches_a_two_rank_run(tmp_path, capsys):
    import numpy as np

    from zephon.testing import run_job
    from zephon.torchtitan import replay
    from zephon.torchtitan.recipe import build_pipeline

    recipe = load_recipe(DEBUG)

    def make(world, rank):
        return build_pipeline(recipe, dp_rank=rank, dp_world_size=world, seq_len=64, microbatch_size=2)

    digests, _ = run_job(make, 2, 7, 1)  # 16 rows a step: 8 lanes x 1 batch of 2 rows
    out = str(tmp_path / "step7.npz")
    geometry = ["--global-batch-size", "16", "--seq-len", "64", "--local-batch-size", "2"]
    assert replay.main(["--recipe", DEBUG, *geometry, "--step", "7", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert f"step 7: digest {digests[6]}" in printed, printed
    assert "replayed from the start of the run" in printed
    assert printed.count(" kjv 65 ") == 16  # every row: 65 tokens of kjv, no padding
    saved = np.load(out)
    assert saved["tokens"].shape == (8, 2, 65) and list(saved["indices"]) == [6] * 8
    assert list(saved["datasets"]) == ["kjv"]


GEOMETRY = ["--global-batch-size", "16", "--seq-len", "128", "--local-batch-size", "2"]


def _replay_error(capsys, *args: str, code: int = 1) -> str:
    """The one line ``python -m zephon.torchtitan.replay --recipe ... args`` ends with, exiting ``code``."""
    from zephon.torchtitan import replay

    if code == 2:  # a usage error: argparse exits
        with pytest.raises(SystemExit) as caught:
            replay.main(list(args))
        assert caught.value.code == 2
    else:
        assert replay.main(list(args)) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_replay_of_step_0_is_a_usage_error_without_a_traceback(capsys):
    line = _replay_error(capsys, "--recipe", DEBUG, *GEOMETRY, "--step", "0", code=2)
    assert line == "python -m zephon.torchtitan.replay: error: argument --step: 0: steps count from 1"


def test_replay_refuses_a_checkpoint_folder_that_does_not_exist_naming_it(tmp_path, capsys):
    missing = str(tmp_path / "checkpoint")
    line = _replay_error(capsys, "--recipe", DEBUG, *GEOMETRY, "--step", "3", "--checkpoint", missing, code=2)
    assert line == (
        f"python -m zephon.torchtitan.replay: error: --checkpoint {missing}: no such folder; give the "
        "folder of the job's step-K checkpoints"
    )


@pytest.mark.parametrize("damaged", [".metadata", "__0_0.distcp"])
def test_replay_names_a_damaged_checkpoint_file_and_what_to_do(tmp_path, capsys, damaged):
    import warnings

    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "checkpoint" / "step-2"
    with warnings.catch_warnings():  # no process group: saved by this process alone
        warnings.simplefilter("ignore")
        dcp.save({"dataloader": {"dp_rank_0": b"state"}}, checkpoint_id=str(folder))
    (folder / damaged).write_bytes(b"\x80\x04 not a pickle")
    line = _replay_error(
        capsys, "--recipe", DEBUG, *GEOMETRY, "--step", "3", "--checkpoint", str(folder.parent)
    )
    assert line.startswith(
        f"python -m zephon.torchtitan.replay: error: checkpoint {folder} cannot be read: {folder / damaged}: "
    )
    assert line.endswith(
        "It is damaged or incomplete (a save cut short?): move it aside, and the replay starts from the "
        "checkpoint before it (or the start)"
    )


def _stopping_recipe(folder, path: str | None = None) -> str:
    from train_jobs import ROOT, recipe_copy

    changes = {'exhausted = "repeat"': 'exhausted = "stop"'}
    if path is not None:
        changes[f'path = "{ROOT}/assets/debug_corpus"'] = f'path = "{path}"'
    return recipe_copy(str(folder), **changes)


def test_replay_of_a_step_past_what_the_bytes_of_stopping_data_hold_is_refused_at_once(tmp_path, capsys):
    import time

    from zephon.testing import synthetic_documents, write_jsonl
    from zephon.torchtitan import replay
    from zephon.torchtitan.recipe import build_pipeline

    data = str(tmp_path / "d.jsonl")
    write_jsonl(data, synthetic_documents(300, seed=7))
    recipe = _stopping_recipe(tmp_path, data)
    start = time.monotonic()
    line = _replay_error(capsys, "--recipe", recipe, *GEOMETRY, "--step", "10000000")
    assert time.monotonic() - start < 10
    size = os.path.getsize(data)
    assert line == (
        "python -m zephon.torchtitan.replay: error: step 10000000 lies past the data: the recipe's "
        f'datasets stop (exhausted = "stop") and their {size:,} bytes make at most 1,064 steps of 16 rows '
        "(at most 19 tokens a byte): replay an earlier step"
    )
    pipeline = build_pipeline(load_recipe(recipe), dp_rank=0, dp_world_size=1, seq_len=128, microbatch_size=2)
    rows = sum(len(b.tokens) for b in pipeline)
    assert 0 < rows <= replay.data_bound(pipeline)[0], "a bound: never below what the data holds"


def test_replay_of_a_step_past_where_a_lane_ends_says_which_steps_the_data_holds(tmp_path, capsys, caplog):
    import logging

    from zephon.torchtitan import replay

    caplog.set_level(logging.INFO)
    recipe = _stopping_recipe(tmp_path)  # Parquet: its bytes bound nothing, the run finds the end
    line = _replay_error(capsys, "--recipe", recipe, *GEOMETRY, "--step", "10000000")
    assert "zephon: replay: step 10000000: making the 79999992 batches before it (8 per step)" in caplog.text
    held = 184
    assert line == (
        "python -m zephon.torchtitan.replay: error: step 10000000 lies past the data: lane 1 ended "
        f'after {held} batches (its datasets stop: exhausted = "stop"), so at this batch size the data '
        f"holds {held} steps: replay step {held} or earlier"
    )
    assert replay.main(["--recipe", recipe, *GEOMETRY, "--step", str(held)]) == 0
    assert f"step {held}: digest " in capsys.readouterr().out
    line = _replay_error(capsys, "--recipe", recipe, *GEOMETRY, "--step", str(held + 1))
    assert line.startswith(
        f"python -m zephon.torchtitan.replay: error: step {held + 1} lies past the data: lane 1 ended"
    )


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            'name = "late"',
            'name = "late"\nweight = 2',
            r"schedule sets the weights; remove `weight` from .*\['late'\]",
        ),
        ("at = 6_000", "at = 0", r"\[mixture\] mixture schedule point 2: at = 0 does not come after"),
        ("late = 0.1 }", "lat = 0.1 }", r"point 1: mixture names unknown dataset\(s\) \['lat'\]"),
        (
            "at = 6_000",
            "at = inf",
            r"\[mixture\] mixture schedule point 2: at = inf should be a whole number",
        ),
        (
            "late = 0.1 }",
            "late = nan }",
            r"\[mixture\] mixture schedule point 1: .*'late' .* got nan: give finite",
        ),
    ],
)
def test_a_bad_schedule_in_a_recipe_is_named(tmp_path, old, new, message):
    from zephon.torchtitan.recipe import build_pipeline

    with open(os.path.join(ROOT, "zephon_recipes", "debug_curriculum.toml")) as f:
        text = f.read().replace('"../assets', f'"{ROOT}/assets')
    path = tmp_path / "r.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ValueError, match=message):
        build_pipeline(load_recipe(str(path)), dp_rank=0, dp_world_size=1, seq_len=128, microbatch_size=2)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (("inf", "1"), r"'early' must be a positive number, got inf: give finite weights"),
        (("1", "nan"), r"'late' must be a positive number, got nan: give finite weights"),
        (("1e308", "1e308"), r"sum to more than the largest float .*: scale them all down"),
        (("1e-320", "1"), r"'early' is 1e-320, under the smallest normal float"),
    ],
)
def test_a_recipe_weight_that_is_not_finite_or_overflows_is_named_with_its_field(tmp_path, weights, message):
    import re

    from zephon.torchtitan.recipe import build_pipeline

    with open(os.path.join(ROOT, "zephon_recipes", "debug_curriculum.toml")) as f:
        text = f.read().replace('"../assets', f'"{ROOT}/assets')
    text = re.sub(r"schedule = \[.*?\n\]\n", "", text, flags=re.S)
    *tables, rest = text.split('exhausted = "repeat"\n')  # each dataset's table ends with it
    text = (
        "".join(f'{t}exhausted = "repeat"\nweight = {w}\n' for t, w in zip(tables, weights, strict=True))
        + rest
    )
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(
        ValueError, match=r"data recipe .*r\.toml: \[\[datasets\]\] weight: mixture weight.* " + message
    ):
        build_pipeline(load_recipe(str(path)), dp_rank=0, dp_world_size=1, seq_len=128, microbatch_size=2)


# -- skipped steps ([data] skip_steps) and data metrics --------------------------------------------


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["4-3"], r"'4-3': the first step is after the last; write 3-4"),
        (["0-2"], r"'0-2': training steps count from 1"),
        (["3-5", "5-6"], r"'3-5' and '5-6' overlap; merge them"),
        (["2", "1-2"], r"'1-2' and '2' overlap"),
        (["3-"], r"'3-' is not a step range"),
        (["three"], r"'three' is not a step range"),
        ("3-4", r"give a list of step ranges"),
    ],
)
def test_bad_skip_steps_are_named_with_the_setting(entries, message):
    from zephon.torchtitan.skips import parse_skip_steps

    with pytest.raises(ValueError, match=r"\[data\] skip_steps \(--dataloader.skip_steps\).*" + message):
        parse_skip_steps(entries)


def test_skip_steps_come_from_the_job_config_or_the_command_line_and_are_checked(tmp_path):
    parse = ZephonConfigManager().parse_args
    job = _job(tmp_path, "")
    with open(job) as f:
        body = f.read()
    with open(job, "w") as f:
        f.write(body.replace("[data]\n", '[data]\nskip_steps = ["1200-1300", 7]\n'))
    config = parse(["--job.config_file", job, "--metrics.log_freq", "3"])
    assert config.dataloader.skip_steps == ["1200-1300", "7"] and config.dataloader.log_freq == 3
    config = parse(["--job.config_file", job, "--dataloader.skip_steps", "3-4,9"])
    assert config.dataloader.skip_steps == ["3-4", "9"]
    with pytest.raises(ValueError, match=r"skip_steps \(--dataloader.skip_steps\): '5-2'"):
        parse(["--job.config_file", job, "--dataloader.skip_steps", "5-2"])
    with open(job, "w") as f:
        f.write(body.replace("[data]\n", '[data]\nskip_steps = ["2-3", "3"]\n'))
    with pytest.raises(ValueError, match=r"'2-3' and '3' overlap"):
        parse(["--job.config_file", job])


def _steps(loaders, steps: int) -> list[list[bytes]]:
    """``steps`` global steps of the ranks' loaders (8 lanes x 1 batch each): per step, the sorted
    bytes of its batches' labels."""
    iterators = [iter(loader) for loader in loaders]
    per_rank = 8 // len(loaders)
    out = []
    for _ in range(steps):
        batches = [next(it)[1].numpy().tobytes() for it in iterators for _ in range(per_rank)]
        out.append(sorted(batches))
    return out


def _reference(steps: int) -> list[list[bytes]]:
    return _steps([_loader(1, 0)], steps)


def test_skipped_steps_shift_the_data_of_every_later_step_and_digests_name_the_data_step(tmp_path):
    import json

    reference = _reference(9)
    digest_file = str(tmp_path / "batch_digests.jsonl")
    skipping = _steps([_loader(1, 0, skip_steps=["2-3", "5"], digest_file=digest_file)], 6)
    data_steps = [1, 4, 5, 6, 8, 9]  # step 2 gets the data of 4 (2-3 skipped), step 5 that of 8
    assert skipping == [reference[d - 1] for d in data_steps]
    with open(digest_file) as f:
        lines = [json.loads(line) for line in f]
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5, 6]
    assert [line.get("data_step", line["step"]) for line in lines] == data_steps
    assert "data_step" not in lines[0], "only where the data is another step's"


def _resume(states: list[dict], world: int, **config) -> list:
    merged = {k: v for state in states for k, v in state.items()}
    loaders = []
    for rank in range(world):
        loader = _loader(world, rank, **config)
        loader.load_state_dict({k: merged[k] for k in loader.state_dict()})
        loaders.append(loader)
    return loaders


@pytest.mark.parametrize(
    ("saved_at", "world"),
    [(2, 4), (3, 4), (5, 1)],
    ids=["before-the-range-on-4", "inside-the-range-on-4", "after-the-range-on-1"],
)
def test_a_skipping_run_resumed_on_another_dp_size_gets_the_shifted_data(saved_at, world):
    reference = _reference(10)
    skips = ["3-4", "6"]  # the second range applies after the resume only if the step count is right
    loaders = [_loader(2, rank, skip_steps=skips) for rank in range(2)]
    first = _steps(loaders, saved_at)
    rest = _steps(_resume([x.state_dict() for x in loaders], world, skip_steps=skips), 7 - saved_at)
    data_steps = [1, 2, 5, 6, 7, 9, 10]  # step 3 gets the data of step 5, step 6 that of 9
    assert first + rest == [reference[d - 1] for d in data_steps]


def test_a_resume_warns_of_changed_skips_keeps_applied_ones_and_ignores_late_ones(caplog):
    reference = _reference(12)
    loader = _loader(2, 0, skip_steps=["3-4"]), _loader(2, 1, skip_steps=["3-4"])
    _steps(loader, 3)  # steps 1, 2 and 3 (the data of 1, 2, 5)
    states = [x.state_dict() for x in loader]
    with caplog.at_level("WARNING"):
        resumed = _resume(states, 4, skip_steps=["2", "6-7"])
    text = caplog.text
    changed = "changed since the checkpoint: was ['3-4'], now ['2', '6-7'] (added ['2', '6-7'], removed"
    assert "skip_steps (--dataloader.skip_steps) " + changed in text
    assert "steps 3-4 were skipped before the checkpoint and stay skipped" in text
    assert "'2' is ignored: it starts at or before step 3, where this run resumes" in text
    # step 4 gets the data of 6; at step 6 two more are skipped: 6 -> 10, 7 -> 11
    assert _steps(resumed, 4) == [reference[d - 1] for d in (6, 7, 10, 11)]


def test_data_metrics_count_tokens_per_dataset_at_log_steps_only():
    loader = _loader(1, 0, log_freq=2, skip_steps=["2"])
    iterator = iter(loader)
    for _ in range(8 * 3):  # three steps: the last batch of step 3 was delivered
        next(iterator)
    assert loader.data_metrics(3) is None, "step 3 is no log step"
    # step 2, a log step, trained on the data of step 3: 3 data steps x 16 rows x 65 tokens
    assert loader.data_metrics(2)["data/tokens/kjv"] == 3 * 16 * 65
    next(iterator)  # the log step's numbers are gathered at its last batch
    for _ in range(7):
        next(iterator)
    # 5 data steps delivered, step 2's data dropped among them; a row: max_length + 1 tokens
    data = loader.data_metrics(4)
    requests, read = data.pop("data/requests/kjv"), data.pop("data/bytes_read/kjv")
    assert data == {"data/tokens/kjv": 5 * 16 * 65, "data/share/kjv": 1.0, "data/skipped_steps": 1}
    assert requests > 4 and read > 100_000, "listing, planning and the chunks' reads of its Parquet files"


def test_data_metrics_count_lanes_once_and_reach_the_trainers_metrics(monkeypatch, caplog):
    import types

    from zephon.torchtitan import metrics

    class TwoReplicasOfTp2:  # 4 ranks: lanes 0-3 on ranks 0 and 1, lanes 4-7 on ranks 2 and 3
        @staticmethod
        def is_available():
            return True

        @staticmethod
        def is_initialized():
            return True

        @staticmethod
        def get_world_size():
            return 4

        @staticmethod
        def get_rank():
            return 0

        @staticmethod
        def all_gather_object(out, mine):
            other = ((4, 5, 6, 7), {"a": 10, "b": 30}, 2, {"a": (3, 300), "b": (1, 100)})
            out[:] = [mine, mine, other, other]

    monkeypatch.setattr(metrics, "dist", TwoReplicasOfTp2)
    io = {"a": {"plan_requests": 5, "plan_bytes": 50, "read_requests": 2, "read_bytes": 200},
          "b": {"plan_requests": 0, "plan_bytes": 0, "read_requests": 1, "read_bytes": 10}}  # fmt: skip
    counts = metrics.gather([0, 1, 2, 3], {"tokens": {"a": 50, "b": 10}, "counters": {}, "io": io})
    # tokens: each replica's lanes once; requests: every process's own (TP peers read for themselves)
    requests = {"a": [2 * 7 + 2 * 3, 2 * 250 + 2 * 300], "b": [2 * 1 + 2 * 1, 2 * 10 + 2 * 100]}
    assert counts == {"tokens": {"a": 60, "b": 40}, "skipped_records": 2, "requests": requests}
    data = metrics.to_metrics(counts, skipped_steps=0)
    assert data == {"data/tokens/a": 60, "data/share/a": 0.6, "data/tokens/b": 40, "data/share/b": 0.4,
                    "data/requests/a": 20, "data/bytes_read/a": 1100, "data/requests/b": 4,
                    "data/bytes_read/b": 220, "data/skipped_records": 2}  # fmt: skip

    logged = []
    processor = types.SimpleNamespace(log=lambda step, *a, extra_metrics=None: logged.append(extra_metrics))
    loader = types.SimpleNamespace(data_metrics=lambda step: data if step == 8 else None)
    metrics.attach(types.SimpleNamespace(dataloader=loader, metrics_processor=processor))
    with caplog.at_level("INFO"):
        processor.log(8, 2.5, 3.0, 1.0, extra_metrics={"n_tokens_seen": 5})
        processor.log(9, 2.5, 3.0, 1.0, extra_metrics={"n_tokens_seen": 6})
    assert logged == [{"n_tokens_seen": 5, **data}, {"n_tokens_seen": 6}]
    assert "zephon: step 8: data a 60.0% (60 tokens), b 40.0% (40 tokens); skipped_records 2" in caplog.text
    assert "step 9" not in caplog.text
