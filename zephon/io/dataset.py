"""`Dataset`: a named set of files, resolved to shards and planned into chunks from metadata."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass, field

import numpy as np

from zephon.io import hub
from zephon.io.chunks import (  # fmt: skip
    Chunk,
    ChunkTable,
    FileTable,
    Group,
    Shard,
    auto_chunk_bytes,
    chunk_table,
)
from zephon.io.formats import ChunkRead, DataError, Format, Records, format_for, split_suffix
from zephon.io.formats.base import content_digest
from zephon.io.formats.imagefolder import is_image, is_metadata
from zephon.io.local_files import LocalFiles
from zephon.io.plain import plain_copy
from zephon.io.remote import (
    LIST_PAGE,
    LOCAL,
    CountedFile,
    IOConfig,
    Opener,
    Requests,
    content_version,
    filesystem,
    is_transient,
    local_file,
    protocol,
    request_slot,
    retrying,
    strong_version,
)  # fmt: skip
from zephon.progress import Progress

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_BLOCK = 8 << 20  # bytes per request when a remote file is read whole to digest it
log = logging.getLogger(__name__)
EXHAUSTED = ("stop", "repeat")
ON_ERROR = ("raise", "skip")


@dataclass(frozen=True)
class DatasetPlan:
    """One dataset's part of a job plan (zephon.jobplan): its format, files (and an image
    folder's images), the fields of its records where the format has a schema, its chunk table."""

    name: str
    format: str
    compression: str | None
    files: FileTable
    images: FileTable | None
    fields: list[str] | None
    chunks: ChunkTable


@dataclass(frozen=True)
class Dataset:
    """A named dataset: a local file, folder or glob, any fsspec URL (``s3://``, ``gs://``,
    ``https://``...), or a Hugging Face split ``hf://ORG/NAME[/CONFIG]/SPLIT``.

    Build it with :meth:`from_path`. Resolution (listing files) and planning (reading metadata)
    happen when a pipeline first starts, once, and are cached on the object.

    - ``format``: ``jsonl``, ``parquet``, ``arrow``, ``text`` or ``webdataset`` (``.tar``); by
      default from the file names. ``imagefolder``: a folder of images with a metadata.jsonl.
    - ``exhausted``: what a lane does when this dataset runs out: ``"stop"`` ends the lane,
      ``"repeat"`` starts a new epoch with a new permutation of the chunks.
    - ``columns``: read only these fields of each record.
    - ``on_error``: what a bad record (a malformed line, a missing or non-text field, a text
      over the size limit, a map or filter function that raises on it) does: ``"raise"`` stops
      the run with an error naming its file and line or row; ``"skip"`` leaves it out, logs a
      warning naming it and counts it (``skipped_records`` in ``stats()`` and the state). A
      record is skipped or not by what it contains, so a resumed run skips the same ones.
    """

    name: str
    path: str
    format: str | None = None
    exhausted: str = "stop"
    columns: tuple[str, ...] | None = None
    storage_options: dict = field(default_factory=dict, compare=False)
    on_error: str = "raise"
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
        on_error: str = "raise",
    ) -> Dataset:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"dataset name {name!r} is not valid: use letters, digits, '_', '-' and '.'")
        if exhausted not in EXHAUSTED:
            raise ValueError(f"dataset {name!r}: exhausted={exhausted!r}, expected one of {EXHAUSTED}")
        if on_error not in ON_ERROR:
            raise ValueError(f"dataset {name!r}: on_error={on_error!r}, expected one of {ON_ERROR}")
        if format is not None:
            format_for(format, None)  # validates the name
        cols = tuple(columns) if columns is not None else None
        return cls(name, str(path), format, exhausted, cols, dict(storage_options or {}), on_error)

    # -- resolution -------------------------------------------------------------------------

    def shards(self, io: IOConfig | None = None) -> list[Shard]:
        if "shards" not in self._cache:
            io, requests = io or IOConfig(), self.planning_requests
            if hub.is_hub_split(self.path):
                shards, fmt = hub.resolve(self.path, io.retries)
                self._cache["hub_format"] = fmt
            elif self.format == "imagefolder":
                shards, self._cache["images"] = _list_image_folder(
                    self.name, self.path, self.storage_options, io, requests
                )
            else:
                shards = _list_shards(self.name, self.path, self.storage_options, io, requests)
            self._cache["shards"] = shards
        return self._cache["shards"]

    def files(self, io: IOConfig | None = None) -> list[Shard]:
        """Every file whose bytes this dataset reads: its shards, and an image folder's images."""
        shards = self.shards(io)
        return shards + self._cache.get("images", [])

    def file_format(self, io: IOConfig | None = None) -> Format:
        if "format" not in self._cache:
            shards = self.shards(io)
            explicit = self.format or self._cache.get("hub_format")
            fmt = _infer_format(self.name, shards, explicit)
            if "images" in self._cache:
                fmt.bind(self._cache["images"])
            self._cache["format"] = fmt
        return self._cache["format"]

    def chunks(
        self, num_lanes: int, chunk_size: int | None = None, chunk_bytes: int | None = None,
        io: IOConfig | None = None, map_fn=map,
    ) -> ChunkTable:  # fmt: skip
        """All chunks of the dataset, from metadata alone; cached per chunking.

        ``chunk_size`` (rows) and ``chunk_bytes``: None chooses them from the dataset's size and
        ``num_lanes`` (see ``zephon.io.chunks``). ``map_fn`` may be a parallel map, for datasets
        of many remote files.
        """
        key = "chunks", num_lanes, chunk_size, chunk_bytes
        if key not in self._cache:
            shards, fmt = self.plain_shards(io), self.plain_format(io)
            if fmt.unit == "bytes":  # the listing's sizes are all it takes
                sizes = shards.sizes if isinstance(shards, FileTable) else np.array([s.size for s in shards])
                self._cache[key] = self._byte_chunks(sizes.astype(np.int64), num_lanes, chunk_bytes)
            else:
                progress = self.progress(len(shards))
                groups = list(map_fn(lambda i: self.file_groups(i, io, progress), range(len(shards))))
                self._cache[key] = self.chunk_table(groups, num_lanes, chunk_size, chunk_bytes)
        return self._cache[key]

    def file_groups(
        self, i: int, io: IOConfig | None = None, progress: Progress | None = None
    ) -> list[Group]:
        """File ``i``'s groups (see ``Format.groups``), its columns checked: one file's planning
        read, for a metadata format (none for a line format)."""
        fmt, shard, opener = self.plain_format(io), self.plain_shards(io)[i], self.opener(io)
        self._check_columns(fmt.schema_names(shard, opener), shard)
        groups = fmt.groups(shard, opener)
        if progress is not None:
            progress.update()
        return groups

    def progress(self, files: int) -> Progress:
        """A progress line for planning ``files`` of this dataset."""
        return Progress(f"planning {self.name}", files, "files")

    def _byte_chunks(self, sizes: np.ndarray, num_lanes: int, chunk_bytes: int | None) -> ChunkTable:
        """A line format's chunks from its files' sizes alone, as arrays: what ``chunk_table``
        makes of its groups, for a million files in a second."""
        step = chunk_bytes or auto_chunk_bytes(int(sizes.sum()), num_lanes)
        zeros = np.zeros(len(sizes), np.int64)
        table = ChunkTable.of(np.arange(len(sizes), dtype=np.int32), zeros, sizes, zeros + step)
        if not len(table):
            raise ValueError(f"dataset {self.name!r} has no records: {self.path}")
        return table

    def chunk_table(self, groups: list[list[Group]], num_lanes: int, chunk_size: int | None,
                    chunk_bytes: int | None) -> ChunkTable:  # fmt: skip
        """The chunks of the files whose groups are ``groups`` (zephon.io.chunks.chunk_table)."""
        table = chunk_table(self.plain_format().unit, groups, num_lanes, chunk_size, chunk_bytes)
        if not len(table):
            raise ValueError(f"dataset {self.name!r} has no records: {self.path}")
        return table

    def plain_shards(self, io: IOConfig | None = None) -> list[Shard]:
        """The shards as read: a compressed line file's decompressed copy in the local cache."""
        if "plain" not in self._cache:
            fmt, shards = self.file_format(io), self.shards(io)
            if fmt.compression is None:
                self._cache["plain"] = shards
            else:
                cache_dir = (io or IOConfig()).cache.dir
                opener = self.opener(io)
                self._cache["plain"] = [plain_copy(s, fmt.compression, opener, cache_dir) for s in shards]
        return self._cache["plain"]

    def _check_columns(self, names: list[str] | None, shard: Shard) -> None:
        missing = [c for c in self.columns or () if names is not None and c not in names]
        if missing:
            raise ValueError(
                f"dataset {self.name!r}: no column(s) {missing} in {shard.url}; its columns are {names}"
            )

    def field_names(self, io: IOConfig | None = None) -> list[str] | None:
        """The fields of this dataset's records, from its first file's schema (Parquet, Arrow;
        ``columns`` where given), or None where the format has no schema."""
        if self.columns is not None:
            return list(self.columns)
        if "fields" not in self._cache:
            shards = self.shards(io)
            self._cache["fields"] = (
                self.file_format(io).schema_names(shards[0], self.opener(io)) if shards else None
            )
        return self._cache["fields"]

    # -- a job plan's part ------------------------------------------------------------------

    def planned(self, num_lanes: int, chunk_size: int | None, chunk_bytes: int | None, io: IOConfig | None,
                map_fn=map) -> DatasetPlan:  # fmt: skip
        """This dataset listed and planned, as a job plan holds it (zephon.jobplan)."""
        return self.listed(io, self.chunks(num_lanes, chunk_size, chunk_bytes, io, map_fn))

    def listed(self, io: IOConfig | None, chunks: ChunkTable | None = None) -> DatasetPlan:
        """This dataset's listing (files, format, fields) as a job plan holds it, with ``chunks``
        where they are planned (else none: a listing to share before planning)."""
        fmt, images = self.file_format(io), self._cache.get("images")
        return DatasetPlan(
            self.name, fmt.name, fmt.compression, FileTable.of(self.shards(io)),
            FileTable.of(images) if images is not None else None, self.field_names(io),
            chunks if chunks is not None else ChunkTable.from_spans([]),
        )  # fmt: skip

    def adopt(
        self, plan: DatasetPlan, num_lanes: int, chunk_size: int | None, chunk_bytes: int | None
    ) -> None:
        """Take the listing and metadata from ``plan`` (made for this dataset): no request made;
        its chunks too, where it has them."""
        self._cache["shards"] = plan.files
        fmt = format_for(plan.format, plan.compression)
        if plan.images is not None:
            self._cache["images"] = list(plan.images)
            fmt.bind(self._cache["images"])
        self._cache["format"], self._cache["fields"] = fmt, plan.fields
        if len(plan.chunks):
            self._cache["chunks", num_lanes, chunk_size, chunk_bytes] = plan.chunks

    def opener(self, io: IOConfig | None = None, requests: Requests | None = None) -> Opener:
        """Opens this dataset's files; what it reads counts in ``requests`` (by default the
        dataset's planning requests)."""
        files = self._cache.get("files") or self._cache.setdefault("files", LocalFiles())
        return Opener(io or IOConfig(), self.storage_options, requests or self.planning_requests, files)

    @property
    def planning_requests(self) -> Requests:
        """What listing and planning this dataset cost the store, in this process."""
        return self._cache.setdefault("requests", Requests())

    def plain_format(self, io: IOConfig | None = None) -> Format:
        """The format of the shards as read (a compressed file's copy is plain)."""
        fmt = self.file_format(io)
        return fmt if fmt.compression is None else format_for(fmt.name, None)

    def read(self, chunk: Chunk, io: IOConfig | None = None) -> Records:
        """The records of ``chunk``; with ``on_error="skip"``, a ``BadRecord`` in place of each
        one that cannot be read."""
        return self.read_chunk(chunk, io).records

    def read_chunk(
        self, chunk: Chunk, io: IOConfig | None = None, requests: Requests | None = None, digest: str = "xxh3"
    ) -> ChunkRead:
        """The records of ``chunk`` (as ``read``) and the digest of the bytes they come from (by
        ``digest``: ``zephon.io.formats.content_digest``); the requests it takes count in ``requests``."""
        shard, fmt = self.plain_shards(io)[chunk.shard], self.plain_format(io)
        try:
            skip = self.on_error == "skip"
            return fmt.read(
                shard, chunk.start, chunk.stop, self.columns, self.opener(io, requests), skip, digest
            )
        except DataError as e:
            original = self.shards(io)[chunk.shard].url
            if original == shard.url:
                raise
            # name the user's file, not the decompressed copy
            raise DataError(str(e).replace(shard.url, f"{original} (decompressed)")) from None

    def locate(self, chunk: Chunk, record: int, io: IOConfig | None = None) -> str:
        """Where record ``record`` of ``chunk`` is: its file and line (line formats) or row."""
        url = self.shards(io)[chunk.shard].url
        fmt = self.plain_format(io)
        if fmt.unit == "rows":
            return f"{url}, row {chunk.start + record}"
        line = fmt.line_of(
            self.plain_shards(io)[chunk.shard], chunk.start, chunk.stop, record, self.opener(io)
        )
        return f"{url}, line {line}"

    def span(self, chunk: Chunk, io: IOConfig | None = None) -> str:
        """Which part of which file ``chunk`` is: ``URL, rows [a, b)`` or ``URL, bytes [a, b)``."""
        url, fmt = self.shards(io)[chunk.shard].url, self.file_format(io)
        unit = self.plain_format(io).unit
        copy = " of its decompressed copy" if unit == "bytes" and fmt.compression is not None else ""
        return f"{url}, {unit} [{chunk.start}, {chunk.stop}){copy}"

    def __getstate__(self):
        # workers get the resolved shards but not cached chunk tables (they can be large)
        state = dict(self.__dict__)
        keep = ("shards", "plain", "format", "hub_format", "images")
        state["_cache"] = {k: v for k, v in self._cache.items() if k in keep}
        return state

    def __setstate__(self, state):
        for k, v in state.items():
            object.__setattr__(self, k, v)


def _list_shards(
    name: str,
    path: str,
    storage_options: dict,
    io: IOConfig,
    requests: Requests,
    every_file: bool = False,
) -> list[Shard]:
    file = local_file(path)
    try:
        fs, root = (None, file) if file is not None else filesystem(path, storage_options)
    except (ValueError, ImportError) as e:
        raise ValueError(f"dataset {name!r}: cannot open {path}: {e}") from e

    def find() -> dict | None:
        if fs is None:  # one local file: what fsspec's listing would say of it (size, following links)
            return {root: {"size": os.stat(root).st_size, "type": "file"}}
        with request_slot(io):
            return _find(fs, root, every_file)

    infos = retrying(f"dataset {name!r} at {path}", find, io.retries)
    local = protocol(path) in LOCAL
    # a local folder: its listing and a stat per file; a store: a listing page per 1,000 files
    requests.add(1 + len(infos or ()) if local else max(1, -(-len(infos or ()) // LIST_PAGE)))
    if infos is None:
        raise FileNotFoundError(f"dataset {name!r}: no such file or folder: {path}")
    if not infos:
        raise ValueError(f"dataset {name!r}: no data files found at {path}")
    if local:
        if every_file:  # an image folder: many files, each versioned by its modification time
            return [Shard(p, int(infos[p]["size"]), _mtime_version(p)) for p in sorted(infos)]
        return [
            Shard(p, int(infos[p]["size"]), _local_version(p, int(infos[p]["size"]), requests))
            for p in sorted(infos)
        ]
    return [_remote_shard(name, fs, p, infos[p], io, requests) for p in sorted(infos)]


def _list_image_folder(
    name: str, path: str, storage_options: dict, io: IOConfig, requests: Requests
) -> tuple[list[Shard], list[Shard]]:
    """A folder of images with its metadata.jsonl: (the metadata files, the image files). Both
    are in the fingerprint (``Dataset.files``); a local image is versioned by its modification
    time, not a sample of its bytes, so that a folder of many images lists fast."""
    all_shards = _list_shards(name, path, storage_options, io, requests, every_file=True)
    metadata = [s for s in all_shards if is_metadata(s.url)]
    images = [s for s in all_shards if is_image(s.url)]
    if not metadata:
        raise ValueError(
            f"dataset {name!r}: format='imagefolder' reads a folder with a metadata.jsonl (one line per "
            f"image: its file_name and caption), and {path} has none"
        )
    return metadata, images


def _remote_shard(name: str, fs, path: str, info: dict, io: IOConfig, requests: Requests) -> Shard:
    """A remote file's shard; its version is what the store names (VersionId, ETag, blob id), or,
    from a server that names none (an HTTP server without ETag), the digest of all its bytes
    (``content_version``): read once, when the dataset is listed."""
    url, size = fs.unstrip_protocol(path), int(info["size"])
    version = strong_version(info)
    if not version:
        log.info("zephon: dataset %r: %s names no version (no ETag): reading it to digest it", name, url)
        progress = Progress(f"digesting {url}", size >> 20, "MB")

        def block(start: int) -> bytes:
            def get() -> bytes:
                with request_slot(io):
                    return fs.cat_file(path, start, start + _BLOCK)

            data = retrying(f"dataset {name!r} at {url}", get, io.retries)
            requests.add(1, len(data))
            progress.update(len(data) >> 20)
            return data

        digest = content_digest(*(block(start) for start in range(0, size, _BLOCK)), algorithm="sha256")
        version = content_version(digest, info)
    return Shard(url, size, version)


def _local_version(path: str, size: int, requests: Requests) -> str:
    """What identifies a local file's contents, cheaply: a sample of them. (Not its
    modification time: a copy to another machine is the same data.)"""
    with open(path, "rb") as raw:
        f = CountedFile(raw, requests)
        return _sample(size, lambda a, b: (f.seek(a), f.read(b - a))[1])


def _mtime_version(path: str) -> str:
    return f"mtime:{os.stat(path).st_mtime_ns}"


def _sample(size: int, read, block: int = 64 << 10) -> str:
    """A digest of the size and the first, middle and last 64 KiB, read by ``read(start, stop)``."""
    digest = hashlib.sha256(str(size).encode())
    for start in sorted({0, max(0, size // 2 - block // 2), max(0, size - block)}):
        digest.update(read(start, min(size, start + block)))
    return "sample:" + digest.hexdigest()[:16]


def _find(fs, root: str, every_file: bool = False) -> dict | None:
    """File infos under ``root`` (a glob, a folder or a file), or None if nothing is there; in a
    folder, the files of a known format (``every_file``: all)."""
    import fsspec

    if fsspec.core.has_magic(root):
        return {p: i for p, i in fs.glob(root, detail=True).items() if i["type"] == "file"}
    try:
        info = fs.info(root)
    except FileNotFoundError as e:
        if is_transient(e):  # "not found" because the host could not be reached
            raise
        return None
    if info["type"] == "directory":
        return {p: i for p, i in fs.find(root, detail=True).items() if every_file or split_suffix(p)[0]}
    return {root: info}


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
            "(jsonl, parquet, arrow, text, webdataset or imagefolder)"
        )
    if len(kinds) > 1:
        raise ValueError(
            f"dataset {name!r} mixes file kinds {sorted(map(str, kinds))}; give each kind its own dataset"
        )
    return format_for(*kinds.pop())
