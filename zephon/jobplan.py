"""The job plan: everything planning reads from the store, made once per job and shared.

Planning lists every dataset's files (names, sizes, versions), reads the metadata chunking needs
(Parquet footers, Arrow batches, tar headers) and cuts each dataset into its chunk table. A
:class:`JobPlan` holds all of it: a pure function of the recipe's datasets and chunking, and of
the store's listing. Given to a pipeline (``pipeline.with_plan(plan)``), it spares the run every
listing and metadata request; a plan that does not belong to the recipe is refused by name.

On disk (``save``/``load``) it is one NumPy ``.npz`` archive: a JSON header and, per dataset, its
files as columns (names under a common root, sizes, versions) and its chunk table as spans.
Sizes: about 100 bytes per file and 36 per span (a line file, a row group), whatever the number
of chunks; ``nbytes`` tells.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from zephon.fingerprint import diff
from zephon.io.chunks import ChunkTable, FileTable
from zephon.io.dataset import Dataset, DatasetPlan

log = logging.getLogger("zephon")

VERSION = 1


@dataclass(frozen=True)
class JobPlan:
    """``recipe``: what the plan was made for (``identity``); ``stats``: what making it cost."""

    recipe: dict
    datasets: list[DatasetPlan]
    stats: dict = field(default_factory=dict)

    @staticmethod
    def identity(
        datasets: list[Dataset], num_lanes: int, chunk_size: int | None, chunk_bytes: int | None
    ) -> dict:
        """What of a recipe a plan depends on: each dataset's place and reading settings, and the
        chunking (num_lanes picks the chunk size where none is given)."""
        return {
            "num_lanes": num_lanes, "chunk_size": chunk_size, "chunk_bytes": chunk_bytes,
            "datasets": [
                {"name": d.name, "path": d.path, "format": d.format, "columns": list(d.columns or []) or None}
                for d in datasets
            ],
        }  # fmt: skip

    def check(self, identity: dict) -> None:
        """Refuse a plan made for another recipe, naming what differs."""
        changes = diff(self.recipe, identity)
        if changes:
            raise ValueError(
                f"this job plan was made for another recipe; differs: {'; '.join(changes)}. Make a plan "
                "for this recipe (pipeline.plan()), or leave the plan out"
            )

    @property
    def files(self) -> int:
        return sum(len(d.files) + len(d.images or ()) for d in self.datasets)

    @property
    def chunks(self) -> int:
        return sum(len(d.chunks) for d in self.datasets)

    def summary(self) -> str:
        counts = ((len(self.datasets), "dataset"), (self.files, "file"), (self.chunks, "chunk"))
        listed = ", ".join(f"{n:,} {noun}{'' if n == 1 else 's'}" for n, noun in counts)
        return f"{listed}, {self.nbytes / 1e6:.1f} MB"

    # -- on disk ----------------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays().values())

    def _arrays(self) -> dict[str, np.ndarray]:
        arrays = {}
        for i, d in enumerate(self.datasets):
            for part, table in (("files", d.files), ("images", d.images)):
                if table is not None:
                    arrays.update({f"{i}.{part}.{k}": v for k, v in table.arrays().items()})
            arrays.update({f"{i}.chunks.{k}": getattr(d.chunks, k) for k in _SPAN_COLUMNS})
        return arrays

    def _header(self) -> dict:
        return {
            "zephon_job_plan": VERSION,
            "recipe": self.recipe,
            "stats": self.stats,
            "datasets": [
                {"name": d.name, "format": d.format, "compression": d.compression, "fields": d.fields,
                 "root": d.files.root, "images_root": d.images.root if d.images is not None else None}
                for d in self.datasets
            ],
        }  # fmt: skip

    def to_bytes(self) -> bytes:
        out = io.BytesIO()
        header = np.frombuffer(json.dumps(self._header()).encode(), np.uint8)
        np.savez(out, header=header, **self._arrays())
        return out.getvalue()

    @staticmethod
    def from_bytes(data: bytes, where: str = "the job plan") -> JobPlan:
        try:
            archive = np.load(io.BytesIO(data), allow_pickle=False)
            header = json.loads(archive["header"].tobytes())
        except Exception as e:
            raise ValueError(f"{where} is not a zephon job plan ({type(e).__name__}: {e})") from None
        if header.get("zephon_job_plan") != VERSION:
            raise ValueError(
                f"{where} is a job plan of version {header.get('zephon_job_plan')!r}; this zephon reads "
                f"version {VERSION}: make the plan again"
            )
        datasets = [_dataset(archive, i, d) for i, d in enumerate(header["datasets"])]
        return JobPlan(header["recipe"], datasets, header.get("stats", {}))

    def save(self, path: str) -> None:
        """Write the plan to ``path`` (atomically: a reader sees the whole file or none)."""
        import os

        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(self.to_bytes())
        os.replace(tmp, path)

    @staticmethod
    def load(path: str) -> JobPlan:
        with open(path, "rb") as f:
            return JobPlan.from_bytes(f.read(), path)


_FILE_COLUMNS = ("names", "name_offsets", "sizes", "versions", "version_offsets")
_SPAN_COLUMNS = ("span_shard", "span_start", "span_stop", "span_step")


def _dataset(archive, i: int, d: dict) -> DatasetPlan:
    """Dataset ``i`` of a plan read back: its header entry ``d`` and its arrays."""

    def table(part: str, root: str | None) -> FileTable | None:
        return None if root is None else FileTable(root, *(archive[f"{i}.{part}.{k}"] for k in _FILE_COLUMNS))

    chunks = ChunkTable.of(*(archive[f"{i}.chunks.{k}"] for k in _SPAN_COLUMNS))
    files, images = table("files", d["root"]), table("images", d["images_root"])
    return DatasetPlan(d["name"], d["format"], d["compression"], files, images, d["fields"], chunks)


def make_plan(datasets: list[Dataset], num_lanes: int, chunk_size: int | None, chunk_bytes: int | None,
              io_config, map_fn=map) -> JobPlan:  # fmt: skip
    """List and plan every dataset (the store's requests of a job start), with progress lines."""
    start = time.monotonic()
    before = [d.planning_requests.as_tuple() for d in datasets]
    entries = [d.planned(num_lanes, chunk_size, chunk_bytes, io_config, map_fn) for d in datasets]
    cost = {}
    for d, (requests, nbytes) in zip(datasets, before, strict=True):
        cost[d.name] = [d.planning_requests.requests - requests, d.planning_requests.bytes - nbytes]
    stats = {"seconds": round(time.monotonic() - start, 3), "requests": cost}
    plan = JobPlan(JobPlan.identity(datasets, num_lanes, chunk_size, chunk_bytes), entries, stats)
    total = sum(r for r, _ in cost.values())
    log.info(
        "zephon: planned %s in %.1f s (%d requests to the stores)", plan.summary(), stats["seconds"], total
    )
    return plan


def changes(plan: JobPlan, datasets: list[Dataset], io_config) -> list[str]:
    """What the store's listing says changed since ``plan`` was made: each dataset listed again
    (names, sizes and versions; no metadata read). Empty: the plan still holds."""
    found = []
    for entry, dataset in zip(plan.datasets, datasets, strict=True):
        fresh = dataclasses.replace(dataset, _cache={})
        was, now = list(entry.files) + list(entry.images or ()), list(fresh.files(io_config))
        if was != now:
            found.append(_difference(entry.name, was, now))
        dataset.planning_requests.add(*fresh.planning_requests.as_tuple())
    return found


def _difference(name: str, was: list, now: list) -> str:
    before, after = {s.url: s for s in was}, {s.url: s for s in now}
    added, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
    changed = sorted(url for url in before.keys() & after.keys() if before[url] != after[url])
    parts = [f"{len(urls)} {what} (first {urls[0]})" for urls, what in
             ((changed, "changed"), (added, "added"), (removed, "removed")) if urls]  # fmt: skip
    return f"dataset {name!r}: files " + ", ".join(parts)


# -- one plan made by many processes ---------------------------------------------------------------
#
# A job of many ranks can split a plan's metadata reads (Parquet footers, Arrow batches, tar
# headers: one or two requests a file) over its ranks: one process lists (``listing``) and shares
# the listing, every rank reads the metadata of its share of the files (``groups``), the ranks
# exchange what they read, and each makes the same plan from it (``from_groups``).


def listing(datasets: list[Dataset], num_lanes: int, chunk_size: int | None, chunk_bytes: int | None,
            io_config) -> JobPlan:  # fmt: skip
    """The datasets listed (files, formats, fields), their chunks not planned yet."""
    start = time.monotonic()
    entries = [d.listed(io_config) for d in datasets]
    stats = {"seconds": round(time.monotonic() - start, 3)}
    return JobPlan(JobPlan.identity(datasets, num_lanes, chunk_size, chunk_bytes), entries, stats)


def groups(listed: JobPlan, datasets: list[Dataset], share: int, shares: int, io_config,
           map_fn=map) -> list[dict[int, list]]:  # fmt: skip
    """Per dataset, the groups of files ``share``, ``share + shares``, ... (``Format.groups``):
    this process's part of the metadata reads, the datasets taking ``listed`` first."""
    chunking = listed.recipe["num_lanes"], listed.recipe["chunk_size"], listed.recipe["chunk_bytes"]
    out = []
    for dataset, entry in zip(datasets, listed.datasets, strict=True):
        dataset.adopt(entry, *chunking)
        mine = range(share, len(dataset.plain_shards(io_config)), shares)
        progress = dataset.progress(len(mine))
        read = map_fn(lambda i, d=dataset, p=progress: d.file_groups(i, io_config, p), mine)
        out.append(dict(zip(mine, read, strict=True)))
    return out


def from_groups(listed: JobPlan, datasets: list[Dataset], parts: list[list[dict[int, list]]],
                seconds: float = 0.0) -> JobPlan:  # fmt: skip
    """The plan made from ``listed`` and every process's ``groups`` (``parts``): the same on
    every process that has them."""
    recipe = listed.recipe
    entries = []
    for d, (dataset, entry) in enumerate(zip(datasets, listed.datasets, strict=True)):
        found = {i: g for part in parts for i, g in part[d].items()}
        files = [found[i] for i in range(len(found))]
        table = dataset.chunk_table(files, recipe["num_lanes"], recipe["chunk_size"], recipe["chunk_bytes"])
        entries.append(dataclasses.replace(entry, chunks=table))
    return JobPlan(recipe, entries, {"seconds": round(seconds, 3), "split": len(parts)})
