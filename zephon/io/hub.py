"""``hf://ORG/NAME[@REVISION][/CONFIG]/SPLIT``: a split of a Hugging Face dataset repo.

Configs and splits are resolved by the `datasets` library itself (the README's ``configs:``
YAML, else its default file patterns), pinned to the repo's current commit. A ``CONFIG`` that is
a folder of a repo without YAML configs is used as ``data_dir``. Data in a format zephon does not
read (CSV, scripts...) is taken from the repo's ``refs/convert/parquet`` branch instead. Files
are then read with range requests through ``huggingface_hub``'s HfFileSystem.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from zephon.io.chunks import Shard
from zephon.io.remote import RetryPolicy, retrying

log = logging.getLogger(__name__)

FILE_PROTOCOL_ROOTS = ("hf://datasets/", "hf://models/", "hf://spaces/", "hf://buckets/")
_FORMATS = {"Parquet": "parquet", "Json": "jsonl", "Text": "text", "Arrow": "arrow"}


def is_hub_split(path: str) -> bool:
    """``hf://ORG/NAME/...`` names a split; ``hf://datasets/...`` is a plain HfFileSystem path."""
    return path.startswith("hf://") and not path.startswith(FILE_PROTOCOL_ROOTS)


@dataclass(frozen=True)
class HubSplit:
    repo: str
    revision: str | None
    config: str | None
    split: str

    @staticmethod
    def parse(path: str) -> HubSplit:
        parts = path[len("hf://") :].strip("/").split("/")
        if len(parts) not in (3, 4) or not all(parts):
            raise ValueError(
                f"{path}: a Hugging Face dataset path is hf://ORG/NAME[/CONFIG]/SPLIT "
                "(or hf://datasets/ORG/NAME/path/to/files for files of a repo)"
            )
        name, _, revision = parts[1].partition("@")
        config = parts[2] if len(parts) == 4 else None
        return HubSplit(f"{parts[0]}/{name}", revision or None, config, parts[-1])


def resolve(path: str, policy: RetryPolicy) -> tuple[list[Shard], str]:
    """The shards of a hub split, and their format name."""
    target = HubSplit.parse(path)
    sha = _commit(target, policy)
    builder = _builder(target, sha, policy)
    files = builder.config.data_files or {}
    if target.split not in files:
        raise ValueError(f"{path}: no split {target.split!r}; the splits are {sorted(map(str, files))}")
    fmt = _format(files[target.split], builder)
    if fmt is None:
        log.info("zephon: %s holds data zephon does not read; using refs/convert/parquet", path)
        converted = HubSplit(target.repo, "refs/convert/parquet", target.config or "default", target.split)
        builder = _builder(converted, converted.revision, policy, data_dir=converted.config)
        files, fmt = builder.config.data_files or {}, "parquet"
        if target.split not in files:
            raise ValueError(f"{path}: the parquet conversion has no split {target.split!r}")
    return [_shard(url, sha, policy) for url in files[target.split]], fmt


def _format(urls: list[str], builder) -> str | None:
    """The format of a split's files: from their names, else from the builder `datasets` chose
    (which is per repo, not per config); None if zephon does not read it."""
    from zephon.io.formats import split_suffix

    kinds = {split_suffix(u)[0] for u in urls}
    if len(kinds) == 1 and None not in kinds:
        return kinds.pop()
    return _FORMATS.get(_builder_kind(builder))


def _commit(target: HubSplit, policy: RetryPolicy) -> str:
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    what = f"hf://{target.repo}"
    try:
        info = retrying(what, lambda: HfApi().dataset_info(target.repo, revision=target.revision), policy)
    except (FileNotFoundError, PermissionError) as e:
        cause = e.__cause__
        if isinstance(cause, RevisionNotFoundError):
            raise ValueError(f"{what}: no revision {target.revision!r}") from e
        if isinstance(cause, RepositoryNotFoundError) or "not found" in str(e):
            raise ValueError(
                f"{what}: no such dataset repo on {constants.ENDPOINT} (or it is private: set HF_TOKEN)"
            ) from e
        raise
    return info.sha


def _builder(target: HubSplit, revision: str, policy: RetryPolicy, data_dir: str | None = None):
    import datasets

    what = f"hf://{target.repo}"
    name = None if data_dir else target.config

    def load(**kwargs):
        return retrying(
            what, lambda: datasets.load_dataset_builder(target.repo, revision=revision, **kwargs), policy
        )

    try:
        return load(name=name, data_dir=data_dir)
    except ValueError as e:
        configs = retrying(
            what, lambda: datasets.get_dataset_config_names(target.repo, revision=revision), policy
        )
        folders = _folders(target.repo, revision) if configs == ["default"] and not data_dir else []
        if target.config in folders:  # a folder of a repo without YAML configs
            builder = load(data_dir=target.config)
            if builder.config.data_files:
                return builder
        wanted = f"no config {target.config!r}" if target.config else "a config is needed"
        also = f" (or one of its folders {folders})" if folders else ""
        raise ValueError(f"{what}: {wanted}; the configs are {configs}{also}") from e


def _folders(repo: str, revision: str) -> list[str]:
    from huggingface_hub import HfFileSystem

    try:
        entries = HfFileSystem().ls(f"datasets/{repo}@{revision}", detail=True)
    except Exception:  # only a hint for an error message
        return []
    return sorted(e["name"].rsplit("/", 1)[-1] for e in entries if e["type"] == "directory")


def _builder_kind(builder) -> str:
    from datasets.packaged_modules.arrow.arrow import Arrow
    from datasets.packaged_modules.json.json import Json
    from datasets.packaged_modules.parquet.parquet import Parquet
    from datasets.packaged_modules.text.text import Text

    for cls in (Parquet, Json, Text, Arrow):
        if isinstance(builder, cls):
            return cls.__name__
    return type(builder).__name__


def _shard(url: str, sha: str, policy: RetryPolicy) -> Shard:
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    info = retrying(url, lambda: fs.info(path), policy)
    return Shard(url, int(info["size"]), (info.get("lfs") or {}).get("sha256") or info.get("blob_id") or sha)
