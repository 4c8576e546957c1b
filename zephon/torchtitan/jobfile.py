"""A job config's file and its command line, read without importing TorchTitan.

What the trainer (zephon.torchtitan.job), the launch check (zephon.torchtitan.check) and the dry
run (zephon.torchtitan.plan) share: the TOML's checks, the command line's names for the job's
settings, the per-recipe dump folder, and the DP size TorchTitan will use.

One name per setting: a setting is written ``[section] key`` in TOML and ``--section.key`` on
the command line, except two that TorchTitan names otherwise, whose TOML names the command line
accepts as well:

    [data] recipe (and num_lanes, seed, runner, parallelism, prefetch, skip_steps)
        --data.recipe  = --dataloader.recipe
    [job] dump_folder (any top-level Trainer.Config field)
        --job.dump_folder  = --dump_folder

and a boolean setting takes ``true`` or ``false`` after it (``--checkpoint.enable false``),
as well as TorchTitan's own flags (``--checkpoint.enable``, ``--checkpoint.no-enable``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from zephon.torchtitan.recipe import read_toml

# [data] keys that override the recipe's values, by the recipe section each overrides
OVERRIDE_SECTIONS = {
    "recipe": ("num_lanes", "seed", "runner", "prefetch"),
    "tokenizer": ("parallelism",),
    "packing": ("document_mask", "max_documents_per_row", "balance_attention"),
}
OVERRIDES = tuple(key for keys in OVERRIDE_SECTIONS.values() for key in keys)
DATA_KEYS = {"recipe", "digests", "loader", "dataset_path", "skip_steps", *OVERRIDES}
LOADERS = ("zephon", "torchtitan")  # torchtitan: its own text loader, for comparisons
# [data] keys that are ZephonDataLoader.Config fields: the same name under --dataloader.
DATA_ON_COMMAND_LINE = ("recipe", *OVERRIDES, "skip_steps")
BOOLEANS = {"true": True, "false": False}


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
    loader = job["data"].get("loader", "zephon")
    if loader not in LOADERS:
        raise ValueError(f"job config {path}: [data] loader = {loader!r}; valid: {list(LOADERS)}")
    return job


def pop_option(args: list[str], name: str) -> tuple[str | None, list[str]]:
    """The value of ``name`` (``--name V`` or ``--name=V``; the last wins) and the other args."""
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


def by_section(value: Callable[[str], Any]) -> dict[str, dict[str, Any]]:
    """load_recipe's overrides: ``value(key)`` of each override key (None: the recipe's own value),
    under the recipe section it overrides."""
    return {section: {key: value(key) for key in keys} for section, keys in OVERRIDE_SECTIONS.items()}


def one_name_per_setting(args: list[str], boolean: Callable[[str], str | None] = lambda _: None) -> list[str]:
    """The command line in TorchTitan's names: ``--data.K`` -> ``--dataloader.K``, ``--job.K`` ->
    ``--K``, and ``--a.b true|false`` in the form the setting takes, where ``boolean("a.b")`` (a
    dotted path, underscores) says it is a boolean: "flag" (``--a.b`` / ``--a.no-b``) or "value"
    (an optional one: ``--a.b True|False``)."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            out.append(arg)
            i += 1
            continue
        name, eq, value = arg[2:].partition("=")
        name = _toml_name(name)
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, given = args[i + 1], 2
        else:
            given = 1
        kind = boolean(name.replace("-", "_")) if value.lower() in BOOLEANS else None
        if kind == "flag":
            out.append(_flag(name, BOOLEANS[value.lower()]))
        elif kind == "value":
            out += [f"--{name}", str(BOOLEANS[value.lower()])]
        else:
            out.append(f"--{name}{eq}{value}" if eq else f"--{name}")
            given = 1
        i += given
    return out


def _toml_name(name: str) -> str:
    section, dot, key = name.partition(".")
    if not dot or section not in ("data", "job"):
        return name
    if section == "job":
        return key
    if key.replace("-", "_") not in DATA_ON_COMMAND_LINE:
        raise ValueError(
            f"--data.{key}: the command line sets [data] {', '.join(DATA_ON_COMMAND_LINE)} "
            f"(--data.KEY or --dataloader.KEY); {sorted(DATA_KEYS - set(DATA_ON_COMMAND_LINE))} only "
            "in the job config's [data]"
        )
    return f"dataloader.{key}"


def _flag(name: str, value: bool) -> str:
    head, _, leaf = name.rpartition(".")
    return f"--{name}" if value else f"--{head + '.' if head else ''}no-{leaf}"


def cli_value(args: list[str], path: str) -> str | None:
    """The value the command line (in TorchTitan's names) gives ``path`` (``training.seq_len``),
    written with underscores or hyphens; the last one wins."""
    value = None
    for i, arg in enumerate(args):
        name, eq, given = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if name.replace("-", "_") != path:
            continue
        if eq:
            value = given
        elif i + 1 < len(args):
            value = args[i + 1]
    return value


CALLER = "ZEPHON_CALLER_DIR"  # run_train.sh: the folder it was started from (it runs in the repository)
PATH_OPTIONS = ("--dataloader.recipe", "--data.recipe", "--dump_folder", "--job.dump_folder")


def from_caller(args: list[str], caller: str | None) -> list[str]:
    """The command line with its relative paths taken from ``caller``, the folder the user ran
    ``run_train.sh`` in (the job runs in the repository): a recipe that is there, and the dump
    folder. None: as given."""
    if not caller:
        return list(args)
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in PATH_OPTIONS and (eq or i + 1 < len(args)):
            value = value if eq else args[i + 1]
            i += 1 if eq else 2
            out += [name, caller_path(value, caller, must_exist="recipe" in name)]
            continue
        out.append(arg)
        i += 1
    return out


def caller_path(path: str, caller: str | None, must_exist: bool = False) -> str:
    """``path`` from the user's folder ``caller`` where it is relative (and, with ``must_exist``,
    found there); else as given: the repository's."""
    if not caller or os.path.isabs(path):
        return path
    candidate = os.path.normpath(os.path.join(caller, path))
    return candidate if os.path.exists(candidate) or not must_exist else path


def recipe_dump_folder(dump_folder: str, job_recipe: str, args: list[str]) -> str:
    """Where a run's outputs go: a command line that names another recipe than the job's
    (``--dataloader.recipe``) and no ``--dump_folder`` gets ``<dump_folder>/<recipe's stem>``, so
    an ablation never resumes the baseline's checkpoints, nor the baseline the ablation's."""
    recipe = cli_value(args, "dataloader.recipe")
    if recipe is None or cli_value(args, "dump_folder") is not None:
        return dump_folder
    if os.path.abspath(recipe) == os.path.abspath(job_recipe):
        return dump_folder
    return os.path.join(dump_folder, os.path.splitext(os.path.basename(recipe))[0])


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


def batch_rows(parallelism, training) -> int:
    """Rows of one microbatch: TorchTitan's pipeline microbatch under PP, else its local batch."""
    if parallelism.pipeline_parallel_degree > 1:
        return parallelism.pipeline_parallel_microbatch_size
    return training.local_batch_size
