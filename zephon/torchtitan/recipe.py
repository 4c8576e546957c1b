"""Data recipes: TOML files that say what the data is and how it is prepared.

A recipe knows nothing of ranks: :func:`build_pipeline` turns it into a zephon pipeline for one
rank, given the numbers TorchTitan decides (dp rank and size, sequence length, batch size).
Relative dataset paths and globs are relative to the recipe file; a tokenizer id is a path
relative to the recipe if such a file or folder exists, else a hub id or tiktoken:NAME. Schema::

    [recipe]                     # all optional
    seed = 0                     # plans and mixture
    num_lanes = 8                # logical data streams; the DP size must divide it
    chunk_size = 1024            # records per chunk (Parquet, Arrow); default: from the data
    chunk_bytes = 1048576        # bytes per chunk (JSON lines, text); default: from the data
    window_rows = 256            # rows per window, a multiple of training.local_batch_size;
                                 # default: the shuffle buffer rounded up to whole microbatches
    runner = "thread"            # inline | thread | process   (performance only)
    prefetch = 4                 # batches per lane prepared ahead (performance only)

    [tokenizer]
    id = "openai-community/gpt2" # a tokenizer.json or its folder, a hub id, tiktoken:NAME
    field = "text"
    parallelism = 4              # workers for read + map + tokenize (performance only)
    add_bos = true               # default: if the tokenizer defines a BOS distinct from EOS
    add_eos = true
    backend = "auto"             # auto: fastokens where verified exact | tokenizers (performance only)

    [[datasets]]                 # one table per dataset
    name = "wiki"
    path = "hf://Salesforce/wikitext/wikitext-103-raw-v1/train"
    weight = 0.5                 # mixture weight (needed with several datasets)
    exhausted = "repeat"         # stop | repeat
    on_error = "raise"           # raise | skip: a bad record stops the run, or is skipped and counted
    format = "parquet"           # optional; from the file names by default
    columns = ["text"]           # optional
    storage_options = {}         # optional, for fsspec URLs

    [mixture]
    unit = "tokens"              # tokens | documents: what the weights count
    schedule = [                 # optional: weights that change over the run (then no `weight`)
      { at = 0, weights = { wiki = 0.7, code = 0.3 } },                  # from the start
      { at = 10_000_000_000, weights = { wiki = 0.3, code = 0.7 } },     # a step at 10B tokens
      { at = 20_000_000_000, weights = { wiki = 0.1, code = 0.9 }, ramp = "linear" },  # a ramp to 20B
    ]                            # `at` counts the run's delivered units (all ranks together)

    [packing]
    algorithm = "wrap"           # wrap | best_fit
    max_length = 2048            # optional; must equal training.seq_len if given
    document_mask = true         # positions restart at each document, so TorchTitan's attention
                                 # masks per document; false: positions count the whole row
    max_documents_per_row = 64   # optional: a row is closed at 64 documents, the rest padded
    balance_attention = false    # true: each window's rows in an order that evens attention cost
                                 # across steps and ranks (zephon.ops.balance)

    [shuffle]                    # optional: a seeded buffer of packed rows per lane
    buffer_size = 1024
    seed = 0

    [io]                         # optional: zephon io_options (cache, retries)
    cache = { enabled = true, dir = "/local/zephon-cache", max_bytes = 500000000000 }
"""

from __future__ import annotations

import inspect
import os
import tomllib
from dataclasses import dataclass, fields
from typing import Any

from zephon import Dataset, MixtureWorkSource, Pipeline, ScheduledMixtureWorkSource
from zephon.fields import check_table
from zephon.options import Options
from zephon.torchtitan.checks import check_context_length
from zephon.work.mixture import UNITS, normalize


def _engine(function: Any, name: str) -> Any:
    """The default of argument ``name`` of the engine's ``function``: a recipe setting that is an
    engine argument takes its default from there, so the two cannot drift apart."""
    return inspect.signature(function).parameters[name].default


@dataclass(frozen=True)
class RecipeSection:
    """[recipe]: the run's options (zephon.options.Options), and the seed of plans and mixture."""

    seed: int = 0
    num_lanes: int = Options.num_lanes
    chunk_size: int | None = Options.chunk_size
    chunk_bytes: int | None = Options.chunk_bytes
    window_rows: int | None = Options.window_rows
    runner: str = Options.runner
    prefetch: int = Options.prefetch

    def options(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "seed"}


@dataclass(frozen=True)
class TokenizerSection:
    """[tokenizer]: ``Pipeline.tokenize``'s arguments."""

    id: str = ""
    field: str = _engine(Pipeline.tokenize, "field")
    parallelism: int | None = _engine(Pipeline.tokenize, "parallelism")
    add_bos: bool | None = _engine(Pipeline.tokenize, "add_bos")
    add_eos: bool = _engine(Pipeline.tokenize, "add_eos")
    backend: str = _engine(Pipeline.tokenize, "backend")

    def arguments(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "id"}


@dataclass(frozen=True)
class DatasetTable:
    """One [[datasets]] table: ``Dataset.from_path``'s arguments and its mixture weight."""

    name: str = ""
    path: str = ""
    weight: float | None = None  # None: 1.0 without a schedule (a schedule sets the weights)
    exhausted: str = _engine(Dataset.from_path, "exhausted")
    on_error: str = _engine(Dataset.from_path, "on_error")
    format: str | None = None
    columns: list | None = None
    storage_options: dict | None = None

    def build(self, path: str) -> Dataset:
        """The dataset, read from ``path`` (this table's path resolved against the recipe)."""
        return Dataset.from_path(
            self.name, path, format=self.format, exhausted=self.exhausted, on_error=self.on_error,
            columns=self.columns, storage_options=self.storage_options,
        )  # fmt: skip


@dataclass(frozen=True)
class MixtureSection:
    """[mixture]: what the weights count (tokens here: a training job's budget is in tokens; the
    engine's MixtureWorkSource counts documents unless told), and an optional schedule."""

    unit: str = "tokens"
    schedule: list | None = None


@dataclass(frozen=True)
class PackingSection:
    """[packing]: ``Pipeline.pack_flat``'s arguments, and ``Pipeline.batch``'s balance_attention."""

    algorithm: str = _engine(Pipeline.pack_flat, "algorithm")
    max_length: int | None = None  # the context length; must equal training.seq_len if given
    document_mask: bool = _engine(Pipeline.pack_flat, "document_mask")
    max_documents_per_row: int | None = _engine(Pipeline.pack_flat, "max_documents_per_row")
    balance_attention: bool = _engine(Pipeline.batch, "balance_attention")

    def pack_arguments(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "document_mask": self.document_mask,
            "max_documents_per_row": self.max_documents_per_row,
        }


@dataclass(frozen=True)
class ShuffleSection:
    """[shuffle]: ``Pipeline.shuffle``'s arguments (the section is optional: no shuffle without it)."""

    buffer_size: int = 1024
    seed: int = _engine(Pipeline.shuffle, "seed")


@dataclass(frozen=True)
class IOSection:
    """[io]: the io_options of zephon.options (cache, retries, max_requests)."""

    cache: dict | None = None
    retries: dict | None = None
    max_requests: int | None = None

    def options(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


SECTIONS = {
    "recipe": RecipeSection,
    "tokenizer": TokenizerSection,
    "mixture": MixtureSection,
    "packing": PackingSection,
    "shuffle": ShuffleSection,
    "io": IOSection,
}


@dataclass(frozen=True)
class Recipe:
    """A parsed, checked recipe, one attribute per section (``main`` is the [recipe] table;
    ``shuffle`` is None where the recipe has no [shuffle]). ``path``: where it was read from."""

    path: str
    main: RecipeSection
    tokenizer: TokenizerSection
    mixture: MixtureSection
    packing: PackingSection
    shuffle: ShuffleSection | None
    io: IOSection
    datasets: tuple[DatasetTable, ...]

    @property
    def num_lanes(self) -> int:
        return self.main.num_lanes

    @property
    def tokenizer_id(self) -> str:
        return self.resolve_id(self.tokenizer.id)

    @property
    def max_length(self) -> int | None:
        return self.packing.max_length

    @property
    def document_mask(self) -> bool:
        return self.packing.document_mask

    def resolve(self, path: str) -> str:
        """A dataset path: URLs and absolute paths as given, others relative to the recipe."""
        if "://" in path or os.path.isabs(path):
            return path
        return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(self.path)), path))

    def resolve_id(self, value: str) -> str:
        """A tokenizer id: a file or folder relative to the recipe if there is one (or the id
        starts with '.'), else as given (a hub id, tiktoken:NAME)."""
        candidate = self.resolve(value)
        return candidate if os.path.exists(candidate) or value.startswith(".") else value


def read_toml(path: str, kind: str, home: str) -> dict[str, Any]:
    """A TOML file, or a ValueError naming it (``kind``: "data recipe"; ``home``: its folder)."""
    if not os.path.isfile(path):
        raise ValueError(f"{kind} {path} not found ({kind}s live in {home}/)")
    with open(path, "rb") as f:
        try:
            return tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{kind} {path}: {e}") from None
        except UnicodeDecodeError:
            raise ValueError(f"{kind} {path} is not a TOML text file (not UTF-8)") from None


def load_recipe(path: str, overrides: dict[str, dict[str, Any]] | None = None) -> Recipe:
    """Read and check a recipe; ``overrides`` ({section: {key: value}}, None values ignored)
    replace its values. Parsed once per process for the same file contents and overrides: the
    job config, the launch checks and every rank's loader share one parse."""
    given = {s: {k: v for k, v in t.items() if v is not None} for s, t in (overrides or {}).items()}
    stat = os.stat(path) if os.path.isfile(path) else None
    key = (os.path.abspath(path), stat and (stat.st_mtime_ns, stat.st_size), repr(sorted(given.items())))
    if key not in _PARSED:
        _PARSED[key] = _parse_recipe(path, {s: t for s, t in given.items() if t})
    return _PARSED[key]


_PARSED: dict[tuple, Recipe] = {}


def _parse_recipe(path: str, overrides: dict[str, dict[str, Any]]) -> Recipe:
    data = read_toml(path, "data recipe", "zephon_recipes")
    datasets = data.pop("datasets", None)
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ValueError(
            f"data recipe {path}: unknown section(s) {unknown}; valid: {[*SECTIONS, 'datasets']}"
        )
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    for section, table in data.items():
        _check_table(path, f"[{section}]", table, SECTIONS[section])
    if not isinstance(datasets, list) or not datasets:
        raise ValueError(f"data recipe {path}: add at least one [[datasets]] table (name, path)")
    for i, table in enumerate(datasets):
        _check_table(path, f"[[datasets]] #{i + 1}", table, DatasetTable)
        for key in ("name", "path"):
            if key not in table:
                raise ValueError(f"data recipe {path}: [[datasets]] #{i + 1} needs {key!r}")
    if "id" not in data.get("tokenizer", {}):
        raise ValueError(f"data recipe {path}: [tokenizer] needs id = (a tokenizer.json, folder, hub id)")
    sections = {name: schema(**data.get(name, {})) for name, schema in SECTIONS.items()}
    sections["main"] = sections.pop("recipe")
    if "shuffle" not in data:
        sections["shuffle"] = None
    return Recipe(path, datasets=tuple(DatasetTable(**table) for table in datasets), **sections)


def _check_table(path: str, where: str, table: Any, schema: type) -> None:
    check_table(table, schema, f"data recipe {path}: {where}")


def check_packing(recipe: Recipe, seq_len: int) -> dict[str, Any]:
    """The recipe's ``pack_flat`` arguments, checked as ``pack_flat`` checks them (at launch)."""
    from zephon.ops import PackFlat

    args = recipe.packing.pack_arguments()
    try:
        PackFlat(seq_len, **args)
    except ValueError as e:
        raise ValueError(f"data recipe {recipe.path}: [packing] {e}") from None
    return args


def build_pipeline(
    recipe: Recipe, *, dp_rank: int, dp_world_size: int, seq_len: int, microbatch_size: int
) -> Pipeline:
    """This rank's pipeline: rows of ``seq_len + 1`` tokens, batches of ``microbatch_size``."""
    check_context_length(recipe, seq_len)
    pipeline = Pipeline(_source(recipe)).options(
        dp_rank=dp_rank, dp_world_size=dp_world_size, io_options=recipe.io.options(), **recipe.main.options()
    )
    pipeline = pipeline.tokenize(recipe.tokenizer_id, **recipe.tokenizer.arguments())
    pipeline = pipeline.pack_flat(seq_len, **check_packing(recipe, seq_len))
    if recipe.shuffle is not None:
        pipeline = pipeline.shuffle(recipe.shuffle.buffer_size, seed=recipe.shuffle.seed)
    return pipeline.batch(microbatch_size, balance_attention=recipe.packing.balance_attention)


def _source(recipe: Recipe) -> MixtureWorkSource | ScheduledMixtureWorkSource:
    """The recipe's datasets, mixed by its weights or its schedule."""
    datasets = [d.build(recipe.resolve(d.path)) for d in recipe.datasets]
    unit, seed, schedule = recipe.mixture.unit, recipe.main.seed, recipe.mixture.schedule
    if unit not in UNITS:
        raise ValueError(f"data recipe {recipe.path}: [mixture] unit = {unit!r}; use one of {UNITS}")
    if schedule is None:
        weights = {d.name: 1.0 if d.weight is None else d.weight for d in recipe.datasets}
        try:
            normalize(weights, list(weights))
        except ValueError as e:
            raise ValueError(f"data recipe {recipe.path}: [[datasets]] weight: {e}") from None
        return MixtureWorkSource(datasets, weights, unit, seed=seed)
    weighted = [d.name for d in recipe.datasets if d.weight is not None]
    if weighted:
        raise ValueError(
            f"data recipe {recipe.path}: [mixture] schedule sets the weights; remove `weight` "
            f"from dataset(s) {weighted}"
        )
    try:
        return ScheduledMixtureWorkSource(datasets, schedule, unit, seed=seed)
    except ValueError as e:
        raise ValueError(f"data recipe {recipe.path}: [mixture] {e}") from None
