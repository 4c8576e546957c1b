"""TOML job configs for TorchTitan 0.3.0, whose own configs are Python (`Trainer.Config`).

A job config names a TorchTitan model config and overrides its sections::

    [model]
    module = "llama3"                # a TorchTitan model family, or a dotted registry module
    config = "llama3_debugmodel"     # the registry function
    [job]
    dump_folder = "./outputs/run"    # top-level Trainer.Config fields
    [training]                       # any Trainer.Config section, under TorchTitan's CLI names
    steps = 100
    [data]
    recipe = "zephon_recipes/debug.toml"
    digests = true                   # write <dump_folder>/batch_digests.jsonl
    runner = "process"               # optional overrides: num_lanes, seed, runner,
                                     # parallelism, prefetch, document_mask,
                                     # max_documents_per_row, balance_attention
    skip_steps = ["1200-1300"]       # drop the data of these training steps (zephon.torchtitan.skips)

``--job.config_file FILE`` selects it; ``--section.field`` on the command line still applies on
top (precedence: command line > TOML > TorchTitan's registry function).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from torchtitan.config import ConfigManager

from zephon.fields import check_table
from zephon.torchtitan import cpu
from zephon.torchtitan.checks import check_attention, check_batch_geometry, check_context_length, check_vocab
from zephon.torchtitan.dataloader import ZephonDataLoader, recipe_overrides
from zephon.torchtitan.recipe import check_packing, load_recipe, read_toml
from zephon.torchtitan.skips import parse_skip_steps
from zephon.torchtitan.tokenizer import ZephonTokenizer

RESERVED = {"model_spec", "dataloader", "tokenizer"}  # set by zephon, not by the job's sections
# [data] keys that override the recipe's values
OVERRIDES = (
    "num_lanes", "seed", "runner", "parallelism", "prefetch",
    "document_mask", "max_documents_per_row", "balance_attention",
)  # fmt: skip
DATA_KEYS = {"recipe", "digests", "loader", "dataset_path", "skip_steps", *OVERRIDES}
LOADERS = ("zephon", "torchtitan")  # torchtitan: its own text loader, for comparisons


class ZephonConfigManager(ConfigManager):
    """TorchTitan's ConfigManager, reading ``--job.config_file`` TOML and wiring zephon in."""

    def _load_config(self, args: list[str]) -> tuple[object, list[str]]:
        path, rest = _pop_option(args, "--job.config_file")
        if path is None:
            raise ValueError("give the job config: --job.config_file train_configs/NAME.toml")
        job = read_job(path)
        model = job.get("model", {})
        base = []
        for key in ("module", "config"):
            if not any(a == f"--{key}" or a.startswith(f"--{key}=") for a in rest):
                if key not in model:
                    raise ValueError(
                        f"job config {path}: [model] needs {key} = ... (e.g. llama3 / llama3_debugmodel)"
                    )
                base += [f"--{key}", str(model[key])]
        config, remaining = super()._load_config(base + rest)
        apply_job(config, job, path)
        return config, remaining

    def parse_args(self, args: list[str] | None = None):
        config = super().parse_args(args)
        finish(config)
        return config


def _pop_option(args: list[str], name: str) -> tuple[str | None, list[str]]:
    value, rest, i = None, [], 0
    while i < len(args):
        if args[i] == name and i + 1 < len(args):
            value, i = args[i + 1], i + 2
        elif args[i].startswith(name + "="):
            value, i = args[i].split("=", 1)[1], i + 1
        else:
            rest.append(args[i])
            i += 1
    return value, rest


def read_job(path: str) -> dict[str, Any]:
    job = read_toml(path, "job config", "train_configs")
    if "data" not in job or "recipe" not in job["data"]:
        raise ValueError(f'job config {path}: add [data] recipe = "zephon_recipes/NAME.toml"')
    unknown = sorted(set(job["data"]) - DATA_KEYS)
    if unknown:
        raise ValueError(
            f"job config {path}: unknown key(s) {unknown} in [data]; valid keys: {sorted(DATA_KEYS)}"
        )
    unknown = sorted(set(job["model"]) - {"module", "config"}) if "model" in job else []
    if unknown:
        raise ValueError(
            f"job config {path}: unknown key(s) {unknown} in [model]; valid keys: ['config', 'module']"
        )
    return job


def apply_job(config, job: dict[str, Any], path: str) -> None:
    """The job's sections onto TorchTitan's config, and zephon's loader and tokenizer in."""
    sections = {
        f.name for f in dataclasses.fields(config) if dataclasses.is_dataclass(getattr(config, f.name))
    }
    sections -= RESERVED
    scalars = {f.name for f in dataclasses.fields(config) if f.name not in sections | RESERVED}
    for name, table in job.items():
        if name in ("model", "data"):
            continue
        if not isinstance(table, dict):
            raise ValueError(f"job config {path}: {name} = ... must be inside a section such as [job]")
        if name == "job":
            _apply(config, table, "job", path, scalars)
        elif name in sections:
            _apply(getattr(config, name), table, name, path)
        else:
            raise ValueError(
                f"job config {path}: unknown section [{name}]; valid sections: "
                f"{sorted([*sections, 'job', 'model', 'data'])}"
            )
    data = job["data"]
    recipe = load_recipe(data["recipe"])  # a bad recipe fails here, before any process starts work
    config.tokenizer = ZephonTokenizer.Config(tokenizer_id=recipe.tokenizer_id)
    digest_file = "batch_digests.jsonl" if data.get("digests") else ""
    loader = data.get("loader", "zephon")
    if loader not in LOADERS:
        raise ValueError(f"job config {path}: [data] loader = {loader!r}; valid: {list(LOADERS)}")
    if loader == "torchtitan":
        if "skip_steps" in data:
            raise ValueError(f"job config {path}: [data] skip_steps needs loader = 'zephon'")
        if "dataset_path" not in data:
            raise ValueError(f"job config {path}: [data] loader = 'torchtitan' needs dataset_path")
        from zephon.torchtitan.baseline import DigestedTextDataLoader

        config.dataloader = DigestedTextDataLoader.Config(
            dataset="c4_test", dataset_path=data["dataset_path"], digest_file=digest_file
        )
        return
    parse_skip_steps(data.get("skip_steps", []))  # a bad range fails here, naming it
    config.dataloader = ZephonDataLoader.Config(
        recipe=data["recipe"],
        **{k: data[k] for k in OVERRIDES if k in data},
        digest_file=digest_file,
        skip_steps=[str(entry) for entry in data.get("skip_steps", [])],
    )


def _apply(obj, table: dict, where: str, path: str, allowed: set[str] | None = None) -> None:
    names = allowed if allowed is not None else {f.name for f in dataclasses.fields(obj)}
    unknown = sorted(set(table) - names)
    if unknown:
        raise ValueError(
            f"job config {path}: [{where}]: unknown key {unknown[0]!r}; valid keys: {sorted(names)}"
        )
    nested = {
        k: v for k, v in table.items() if isinstance(v, dict) and dataclasses.is_dataclass(getattr(obj, k))
    }
    check_table({k: v for k, v in table.items() if k not in nested}, obj, f"job config {path}: [{where}]")
    for key, value in table.items():
        if key in nested:
            _apply(getattr(obj, key), value, f"{where}.{key}", path)
        else:
            setattr(obj, key, value)


def finish(config) -> None:
    """After the command line: place the digest file, check the launch numbers and the skipped
    steps, pass the metrics' log_freq to the loader, CPU switches."""
    loader = config.dataloader
    if getattr(loader, "digest_file", "") and not os.path.isabs(loader.digest_file):
        loader.digest_file = os.path.join(config.dump_folder, loader.digest_file)
    if hasattr(loader, "global_batch_size"):
        loader.global_batch_size = config.training.global_batch_size
    if not isinstance(loader, ZephonDataLoader.Config):  # torchtitan's loader, for comparisons
        cpu.configure(config)
        return
    parse_skip_steps(loader.skip_steps)
    loader.log_freq = config.metrics.log_freq
    recipe = load_recipe(loader.recipe, recipe_overrides(loader))
    check_context_length(recipe, config.training.seq_len)
    check_packing(recipe, config.training.seq_len)
    check_attention(config.model_spec.model, recipe.document_mask)
    from torchtitan.models.common.config_utils import decoder_vocab_size

    from zephon.io.tokenizer import load_tokenizer

    check_vocab(
        load_tokenizer(recipe.tokenizer_id).vocab_size,
        decoder_vocab_size(config.model_spec),
        recipe.tokenizer_id,
    )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    check_batch_geometry(
        num_lanes=recipe.num_lanes,
        dp_world_size=data_parallel_size(config.parallelism, world),
        local_batch_size=_batch_rows(config),
        global_batch_size=config.training.global_batch_size,
    )
    cpu.configure(config)


def data_parallel_size(parallelism, world_size: int) -> int:
    """The batch (DP) degree TorchTitan will use: ranks of one TP/CP/PP group share data."""
    others = (
        parallelism.tensor_parallel_degree
        * parallelism.context_parallel_degree
        * parallelism.pipeline_parallel_degree
    )
    shard = parallelism.data_parallel_shard_degree
    if shard == -1:
        shard = world_size // (others * parallelism.data_parallel_replicate_degree)
    return parallelism.data_parallel_replicate_degree * shard


def _batch_rows(config) -> int:
    if config.parallelism.pipeline_parallel_degree > 1:
        return config.parallelism.pipeline_parallel_microbatch_size
    return config.training.local_batch_size
