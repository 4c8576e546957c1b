"""`Dataset`: a named set of files, resolved to shards and planned into chunks from metadata."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

import fsspec
from fsspec.utils import get_protocol

from zephon.io.chunks import Chunk, ChunkTable, Shard
from zephon.io.formats import Format, Records, format_for, split_suffix

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
EXHAUSTED = ("stop", "repeat")


@dataclass(frozen=True)
class Dataset:
    """A named dataset: a local file, folder or glob, or any fsspec URL.

    Build it with :meth:`from_path`. Resolution (listing files) and planning (reading metadata)
    happen when a pipeline first starts, once, and are cached on the object.

    - ``format``: ``jsonl``, ``parquet``, ``arrow`` or ``text``; by default from the file names.
    - ``exhausted``: what a lane does when this dataset runs out: ``"stop"`` ends the lane,
      ``"repeat"`` starts a new epoch with a new permutation of the chunks.
    - ``columns``: read only these fields of each record.
    """

    name: str
    path: str
    format: str | None = None
    exhausted: str = "stop"
    columns: tuple[str, ...] | None = None
    storage_options: dict = field(default_factory=dict, compare=False)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_path(
        cls,
        name: str,
        path: str,
        *,
        format: str | None = None,
        exhausted: str = "stop",
        columns: list[str] | tuple[str, ...] | None = None,
        storage_options: dict | None = None,
    ) -> Dataset:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"dataset name {name!r} is not valid: use letters, digits, '_', '-' and '.'")
        if exhausted not in EXHAUSTED:
            raise ValueError(f"dataset {name!r}: exhausted={exhausted!r}, expected one of {EXHAUSTED}")
        if format is not None:
            format_for(format, None)  # validates the name
        cols = tuple(columns) if columns is not None else None
        return cls(name, str(path), format, exhausted, cols, dict(storage_options or {}))

    # -- resolution -------------------------------------------------------------------------

    def shards(self) -> list[Shard]:
        if "shards" not in self._cache:
            self._cache["shards"] = _list_shards(self.name, self.path, self.storage_options)
        return self._cache["shards"]

    def file_format(self) -> Format:
        if "format" not in self._cache:
            self._cache["format"] = _infer_format(self.name, self.shards(), self.format)
        return self._cache["format"]

    def chunks(self, chunk_size: int, chunk_bytes: int) -> ChunkTable:
        """All chunks of the dataset, from metadata alone; cached per chunk size."""
        key = ("chunks", chunk_size, chunk_bytes)
        if key not in self._cache:
            fmt, ranges = self.file_format(), []
            for i, shard in enumerate(self.shards()):
                ranges += [
                    (i, a, b) for a, b in fmt.plan(shard, chunk_size, chunk_bytes, **self.storage_options)
                ]
            if not ranges:
                raise ValueError(f"dataset {self.name!r} has no records: {self.path}")
            self._cache[key] = ChunkTable.from_ranges(ranges)
        return self._cache[key]

    def read(self, chunk: Chunk) -> Records:
        shard = self.shards()[chunk.shard]
        return self.file_format().read(shard, chunk.start, chunk.stop, self.columns, **self.storage_options)

    def fingerprint(self) -> str:
        """A digest of what shapes this dataset's data: its files, their sizes, its settings."""
        shards = self.shards()
        root = _common_root([s.url for s in shards])
        content = [(s.url[len(root) :], s.size) for s in shards]
        # the path itself is left out: the same files mounted elsewhere are the same data
        settings = [self.name, repr(self.file_format()), self.exhausted, self.columns]
        return hashlib.sha256(json.dumps([settings, content]).encode()).hexdigest()[:16]

    def __getstate__(self):
        # workers get the resolved shards but not cached chunk tables (they can be large)
        state = dict(self.__dict__)
        state["_cache"] = {k: v for k, v in self._cache.items() if k in ("shards", "format")}
        return state

    def __setstate__(self, state):
        for k, v in state.items():
            object.__setattr__(self, k, v)


def _list_shards(name: str, path: str, storage_options: dict) -> list[Shard]:
    try:
        fs, root = fsspec.core.url_to_fs(path, **storage_options)
    except (ValueError, ImportError) as e:
        raise ValueError(f"dataset {name!r}: cannot open {path}: {e}") from e
    if fsspec.core.has_magic(root):
        found = fs.glob(root, detail=True)
        infos = {p: i for p, i in found.items() if i["type"] == "file"}
    elif fs.isdir(root):
        infos = {p: i for p, i in fs.find(root, detail=True).items() if split_suffix(p)[0]}
    elif fs.exists(root):
        infos = {root: fs.info(root)}
    else:
        raise FileNotFoundError(f"dataset {name!r}: no such file or folder: {path}")
    if not infos:
        raise ValueError(f"dataset {name!r}: no data files found at {path}")
    local = get_protocol(path) in ("file", "local")
    return [Shard(p if local else fs.unstrip_protocol(p), int(infos[p]["size"])) for p in sorted(infos)]


def _infer_format(name: str, shards: list[Shard], explicit: str | None) -> Format:
    kinds = {split_suffix(s.url) for s in shards}
    if explicit is not None:
        compressions = {c for _, c in kinds}
        if len(compressions) > 1:
            raise ValueError(f"dataset {name!r} mixes compressions {sorted(map(str, compressions))}")
        return format_for(explicit, compressions.pop())
    if (None, None) in kinds:
        unknown = next(s.url for s in shards if split_suffix(s.url) == (None, None))
        raise ValueError(
            f"dataset {name!r}: cannot tell the format of {unknown}; pass format= "
            "(jsonl, parquet, arrow or text)"
        )
    if len(kinds) > 1:
        raise ValueError(
            f"dataset {name!r} mixes file kinds {sorted(map(str, kinds))}; give each kind its own dataset"
        )
    return format_for(*kinds.pop())


def _common_root(urls: list[str]) -> str:
    if len(urls) == 1:
        return urls[0].rsplit("/", 1)[0] + "/"
    prefix = urls[0]
    for u in urls[1:]:
        while not u.startswith(prefix):
            prefix = prefix[:-1]
    return prefix[: prefix.rfind("/") + 1]
