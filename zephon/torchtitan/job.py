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
top (precedence: command line > TOML > TorchTitan's registry function), under TorchTitan's names
or the TOML's (``--data.recipe``, ``--job.dump_folder``; ``--checkpoint.enable false``: see
zephon.torchtitan.jobfile). A ``--dataloader.recipe`` other than the job's, without
``--dump_folder``, puts the run's outputs in ``<dump_folder>/<recipe's stem>``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import typing
from typing import Any

from torchtitan.config import ConfigManager

from zephon.fields import check_table
from zephon.torchtitan import cpu
from zephon.torchtitan.checks import (
    attention_kinds,
    check_attention,
    check_batch_geometry,
    check_context_length,
    check_vocab,
)
from zephon.torchtitan.dataloader import ZephonDataLoader, recipe_overrides
from zephon.torchtitan.jobfile import (
    CALLER,
    OVERRIDES,
    batch_rows,
    caller_path,
    cli_value,
    data_parallel_size,
    from_caller,
    one_name_per_setting,
    pop_option,
    read_job,
    recipe_dump_folder,
)
from zephon.torchtitan.recipe import check_packing, load_recipe
from zephon.torchtitan.skips import parse_skip_steps
from zephon.torchtitan.tokenizer import ZephonTokenizer

log = logging.getLogger(__name__)

RESERVED = {"model_spec", "dataloader", "tokenizer"}  # set by zephon, not by the job's sections


class ZephonConfigManager(ConfigManager):
    """TorchTitan's ConfigManager, reading ``--job.config_file`` TOML and wiring zephon in. The
    command line may use the TOML's names too (zephon.torchtitan.jobfile)."""

    def _load_config(self, args: list[str]) -> tuple[object, list[str]]:
        path, rest = pop_option(args, "--job.config_file")
        rest = from_caller(rest, os.environ.get(CALLER))
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
        remaining = one_name_per_setting(remaining, lambda name: _boolean(config, name))
        self._job, self._args = job, remaining
        return config, remaining

    def parse_args(self, args: list[str] | None = None):
        config = super().parse_args(args)
        # the job config's dump folder, like the command line's paths, from the user's folder
        config.dump_folder = caller_path(config.dump_folder, os.environ.get(CALLER))
        folder = recipe_dump_folder(config.dump_folder, self._job["data"]["recipe"], self._args)
        if folder != config.dump_folder:
            log.info(
                "zephon: --dataloader.recipe %s is not the job's recipe: this run's outputs go to %s "
                "(each recipe its own folder; --dump_folder chooses another)",
                config.dataloader.recipe, folder,
            )  # fmt: skip
            config.dump_folder = folder
        finish(config)
        return config

    def _validate_config(self) -> None:
        given = "hf_assets_path" in self._job.get("job", {}) or cli_value(self._args, "hf_assets_path")
        if not given and not os.path.exists(self.config.hf_assets_path):
            # The model config's default HF assets folder (./tests/assets/tokenizer for the debug
            # model) is absent, and zephon's tokenizer comes from the recipe, not from it. Left as
            # it is, every run and replay warns "HF assets path ... does not exist!" (here) and
            # "model.safetensors.index.json not found" (the model's state dict adapter): a new user
            # thinks something is missing. Empty, neither looks for it; a job that loads or saves
            # HF weights sets hf_assets_path ([job] or --hf_assets_path) and is checked as before.
            self.config.hf_assets_path = ""
            return
        super()._validate_config()


def _boolean(config, name: str) -> str | None:
    """How the setting at dotted ``name`` (``checkpoint.enable``) of ``config`` is a boolean on the
    command line: "flag" (``--a.b`` / ``--a.no-b``), "value" (``bool | None``: ``--a.b True``), or
    None (not a boolean, or no such setting)."""
    head, _, leaf = name.rpartition(".")
    for part in head.split(".") if head else ():
        config = getattr(config, part, None)
    if not dataclasses.is_dataclass(config) or not hasattr(config, leaf):
        return None
    try:
        hint = typing.get_type_hints(type(config)).get(leaf)
    except Exception:  # a forward reference TorchTitan's module cannot resolve: go by the value
        hint = type(getattr(config, leaf))
    if hint is bool:
        return "flag"
    return "value" if hint == bool | None else None


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
    if data.get("loader", "zephon") == "torchtitan":
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
    if hasattr(loader, "plan_folder") and not loader.plan_folder:
        loader.plan_folder = os.path.join(config.dump_folder, "zephon", "plans")
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
    check_attention(attention_kinds(config.model_spec.model), recipe.document_mask)
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
        local_batch_size=batch_rows(config.parallelism, config.training),
        global_batch_size=config.training.global_batch_size,
    )
    cpu.configure(config)
