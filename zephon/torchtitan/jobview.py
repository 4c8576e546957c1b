"""The settings of a job that decide its data, read in a fraction of a second, without TorchTitan.

TorchTitan's own parse (zephon.torchtitan.job) imports torch and the model code: about 7 s of CPU
before the first check. The launch check (zephon.torchtitan.check) and the dry run
(zephon.torchtitan.plan) need a handful of numbers, so they read them as the trainer does, with
the same precedence: the command line (TorchTitan's names or the TOML's), then the job config's
TOML, then the model config (TorchTitan's registry function). What comes from the model config
(its vocabulary and its defaults for the settings below) is read once per TorchTitan version and
model config, with TorchTitan, and kept in ``~/.cache/zephon/models/`` (a shorthand module such as
``llama3`` only: a user's own registry module may change, so it is read every time).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from types import SimpleNamespace
from typing import Any

from zephon.torchtitan.jobfile import (
    BOOLEANS,
    CALLER,
    OVERRIDES,
    by_section,
    caller_path,
    cli_value,
    from_caller,
    one_name_per_setting,
    read_job,
    recipe_dump_folder,
)  # fmt: skip

TRAINING = ("seq_len", "local_batch_size", "global_batch_size", "steps")
PARALLELISM = (
    "data_parallel_replicate_degree",
    "data_parallel_shard_degree",
    "tensor_parallel_degree",
    "context_parallel_degree",
    "pipeline_parallel_degree",
    "pipeline_parallel_microbatch_size",
)
SWITCHES = ("document_mask", "balance_attention")
FACTS_VERSION = 2  # of what read_model_facts keeps: a new field starts a new cache file
log = logging.getLogger(__name__)

CACHE = os.path.join("~", ".cache", "zephon", "models")


@dataclass
class JobView:
    """What a job's data depends on. ``loader``: "zephon", or "torchtitan" (its own loader)."""

    path: str
    recipe: str
    overrides: dict  # the job's [data] overrides of the recipe (jobfile.OVERRIDES), for load_recipe
    skip_steps: list[str]
    loader: str
    dump_folder: str
    training: SimpleNamespace  # seq_len, local_batch_size, global_batch_size, steps
    parallelism: SimpleNamespace  # the degrees TorchTitan's DP size follows from
    vocab_size: int
    attention: list[tuple[str, str]]  # each attention layer and its kind (checks.attention_kinds)


def read(path: str, args: list[str], cache: str = CACHE) -> JobView:
    """The job config at ``path`` with the command line ``args`` (``--section.field value`` ...)."""
    job = read_job(path)
    caller = os.environ.get(CALLER)
    args = one_name_per_setting(from_caller(args, caller))
    model = {**job.get("model", {})}
    for key in ("module", "config"):
        model[key] = cli_value(args, key) or model.get(key)
        if not model[key]:
            raise ValueError(
                f"job config {path}: [model] needs {key} = ... (e.g. llama3 / llama3_debugmodel)"
            )
    facts = model_facts(model["module"], model["config"], cache)
    data = job["data"]
    recipe = cli_value(args, "dataloader.recipe") or data["recipe"]
    skips = cli_value(args, "dataloader.skip_steps")
    dump = cli_value(args, "dump_folder") or job.get("job", {}).get("dump_folder") or facts["dump_folder"]
    dump = caller_path(dump, caller)
    return JobView(
        path=path,
        recipe=recipe,
        overrides=_loader_overrides(data, args),
        skip_steps=skips.split(",") if skips is not None else [str(s) for s in data.get("skip_steps", [])],
        loader=data.get("loader", "zephon"),
        dump_folder=recipe_dump_folder(dump, data["recipe"], args),
        training=_section("training", TRAINING, job, args, facts),
        parallelism=_section("parallelism", PARALLELISM, job, args, facts),
        vocab_size=facts["vocab_size"],
        attention=[tuple(kind) for kind in facts["attention"]],
    )


def _loader_overrides(data: dict, args: list[str]) -> dict:
    """The recipe settings the job overrides, as ZephonDataLoader passes them to load_recipe."""
    values = {}
    for key in OVERRIDES:
        given = cli_value(args, f"dataloader.{key}")
        value = given if given is not None else data.get(key)
        where = f"--dataloader.{key}" if given is not None else f"job config [data] {key}"
        if value is not None and key in SWITCHES:
            value = _bool(value, where)
        elif value is not None and key != "runner":
            value = _int(value, where)
        values[key] = value
    return by_section(values.get)


def _section(name: str, keys: tuple[str, ...], job: dict, args: list[str], facts: dict) -> SimpleNamespace:
    table = job.get(name, {})
    values = {}
    for key in keys:
        given = cli_value(args, f"{name}.{key}")
        if given is not None:
            values[key] = _int(given, f"--{name}.{key}")
        elif key in table:
            values[key] = _int(table[key], f"job config [{name}] {key}")
        else:
            values[key] = facts[name][key]
    return SimpleNamespace(**values)


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in BOOLEANS:
        return BOOLEANS[value.lower()]
    raise ValueError(f"{where} = {value!r} should be true or false")


def _int(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise ValueError(f"{where} = {value!r} should be an int")


def model_facts(module: str, config: str, cache: str = CACHE) -> dict:
    """The model config's vocabulary and defaults: from the cache, else read with TorchTitan."""
    shorthand = "." not in module
    name = f"torchtitan-{_torchtitan_version()}-v{FACTS_VERSION}.json"
    path = os.path.join(os.path.expanduser(cache), name)
    known = _load(path) if shorthand else {}
    key = f"{module}/{config}"
    if key not in known:
        if shorthand:
            log.info("zephon: reading TorchTitan's model config %s once (kept in %s)", key, path)
        known[key] = read_model_facts(module, config)
        if shorthand:
            _save(path, known)
    return known[key]


def read_model_facts(module: str, config: str) -> dict:
    """What :func:`read` needs of a TorchTitan model config, read with TorchTitan (seconds)."""
    from torchtitan.config import ConfigManager
    from torchtitan.models.common.config_utils import decoder_vocab_size

    from zephon.torchtitan.checks import attention_kinds

    try:
        loaded, _ = ConfigManager()._load_config(["--module", module, "--config", config])
    except ImportError as e:
        cause = _import_failure(module)
        raise ValueError(f"[model] module = {module!r}: {e}{cause}") from None
    return {
        "vocab_size": decoder_vocab_size(loaded.model_spec),
        "attention": attention_kinds(loaded.model_spec.model),
        "dump_folder": loaded.dump_folder,
        "training": {k: getattr(loaded.training, k) for k in TRAINING},
        "parallelism": {k: getattr(loaded.parallelism, k) for k in PARALLELISM},
    }


# where TorchTitan's ConfigManager looks for a model module's config_registry
_MODEL_PACKAGES = ("torchtitan.models", "torchtitan.experiments", "torchtitan.experiments.rl.examples")


def _import_failure(module: str) -> str:
    """Why a model module that exists does not import, as text to append to TorchTitan's message
    (which drops it: a torch older than TorchTitan needs, a missing package); "" where no such
    module exists, or where the first one there imports (the failure is elsewhere). On the error
    path only: a module that failed for TorchTitan is imported again here."""
    import importlib

    for name in _model_modules(module):
        try:
            importlib.import_module(name)
        except Exception as e:  # the module is there and fails as it imports: the cause
            if isinstance(e, ModuleNotFoundError) and e.name == name:  # its package is, it is not
                continue
            return f". {name} is there but does not import: {type(e).__name__}: {e}{_torch_hint(e)}"
        return ""  # as TorchTitan, the first that imports is the one
    return ""


def _model_modules(module: str) -> list[str]:
    """The modules TorchTitan's ConfigManager would import for ``module`` that are there: found
    by their files, without importing TorchTitan's other packages (some set variables)."""
    import importlib.util

    root = os.path.dirname(importlib.util.find_spec("torchtitan").origin)
    names = []
    for package in _MODEL_PACKAGES:
        path = os.path.join(root, *package.split(".")[1:], *module.split("."))
        if os.path.isdir(path) or os.path.isfile(path + ".py"):
            names.append(f"{package}.{module}.config_registry")
    if names:
        return names
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    except Exception:  # a package above it is there and fails as it imports
        found = True
    return [module] if found else []


def _torch_hint(error: Exception) -> str:
    """Where a name torch lacks is the cause and torch is not the one TorchTitan 0.3.0 needs."""
    import torch

    from_torch = isinstance(error, ImportError) and (error.name or "").split(".")[0] == "torch"
    if not from_torch or torch.__version__.startswith("2.13"):
        return ""
    return f" (this is torch {torch.__version__}; TorchTitan 0.3.0 needs torch 2.13.0)"


def _torchtitan_version() -> str:
    try:
        return version("torchtitan")
    except PackageNotFoundError:
        raise ValueError("TorchTitan is not installed: pip install -e '.[torchtitan]'") from None


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}  # no cache yet, or a damaged one: the facts are read again


def _save(path: str, known: dict) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(known, f, indent=1, sort_keys=True)
        os.replace(tmp, path)  # readers see the old file or the new one, never half of one
    except OSError:
        pass  # only a cache: the next check reads the model config again
