"""The recipe fingerprint: everything that shapes the data, and the table of what may change.

A state saved by a run holds the fingerprint of its recipe; a restore compares it with the
fingerprint of the recipe at hand and refuses any difference, naming it (``check_restore``). This
module makes the fingerprint and owns that table; the parts only say what they hold.

What shapes the data (in the fingerprint)::

    plan_version                 how chunks are dealt to lanes (zephon.work.plan)
    source.datasets.NAME         settings: name, format, exhausted, columns, on_error (digest)
                                 files: each file's name, size and version (zephon.io.versions)
    source.mixture, mixture_unit the weights and what they count; source.schedule, if any
    source.seed                  the seed of the chunk permutations
    options                      num_lanes, chunk_size, chunk_bytes, window_rows
    operators                    each operator's parameters (tokenizer content, field, BOS/EOS,
                                 max_length, packing, shuffle buffer and seed, microbatch size,
                                 map and filter functions' code, images' size and Pillow version
                                 and a decoder or resizer other than Pillow with its version)

What may change between save and restore (``MAY_CHANGE``): the settings below. They decide how
fast the data comes and which process makes which lanes, never what a lane holds.
"""

from __future__ import annotations

import hashlib
import json

from zephon.io.chunks import common_root
from zephon.io.versions import FileVersions

PLAN_VERSION = 2

MAY_CHANGE = {
    "dp_rank": "which lanes this process delivers",
    "dp_world_size": "how many processes share the lanes (any divisor of num_lanes)",
    "runner": "inline, thread or process workers",
    "prefetch": "batches made ahead",
    "prefetch_bytes": "memory of batches made ahead",
    "read_parallelism": "files read at once while planning",
    "io_options": "the block cache and retries of remote reads",
    "worker_timeout": "the watchdog of stuck workers",
    "tokenize(parallelism)": "workers that read and tokenize",
    "tokenize(backend)": "fastokens or tokenizers: the same ids",
    "images(parallelism)": "workers that decode images",
}
# the options among them (the rest are operator settings or a rank's place)
PERFORMANCE_OPTIONS = (
    "runner", "prefetch", "prefetch_bytes", "read_parallelism", "io_options", "worker_timeout"
)  # fmt: skip
SHAPING_OPTIONS = ("num_lanes", "chunk_size", "chunk_bytes", "window_rows")


def of_spec(spec) -> dict:
    """The fingerprint of a recipe (a zephon.spec.RunSpec), readable so that a difference can be named."""
    options = spec.options
    return {
        "plan_version": PLAN_VERSION,
        "source": of_source(spec.source, options.io),
        "options": {
            **{k: getattr(options, k) for k in SHAPING_OPTIONS},
            "window_rows": spec.window_rows(),
        },
        "operators": [{"kind": op.kind, **op.params()} for op in spec.operators],
    }


def of_source(source, io=None) -> dict:
    out = {
        "datasets": {d.name: of_dataset(d, io) for d in source.datasets},
        "mixture": dict(zip(source.names, source.shares, strict=True)),
        "mixture_unit": source.unit,
        "seed": source.seed,
    }
    schedule = getattr(source, "schedule", None)
    if schedule is not None:
        out["schedule"] = schedule.to_json()
    return out


def of_dataset(dataset, io=None) -> dict:
    """A dataset: a digest of its settings, and its files (names relative to their common
    folder, sizes, versions) as ``FileVersions``, which can say which file changed. The path is
    left out: the same files mounted elsewhere are the same data."""
    shards = dataset.files(io)
    settings = [dataset.name, repr(dataset.file_format(io)), dataset.exhausted, dataset.columns]
    if dataset.on_error != "raise":
        settings.append(dataset.on_error)
    return {
        "settings": hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16],
        "files": FileVersions.of(shards, common_root([s.url for s in shards])),
    }


def diff(saved, current, path: str = "") -> list[str]:
    """Readable differences between two fingerprints: ``path: saved -> current``, or what a
    current value with an ``explain(saved)`` method (a dataset's files) says changed."""
    explain = getattr(current, "explain", None)
    if explain is not None and saved != current:
        return [f"{path}: {line}" for line in explain(saved)]
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current), key=str):
            sub = f"{path}.{key}" if path else str(key)
            out += diff(saved.get(key, "<absent>"), current.get(key, "<absent>"), sub)
        return out
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        return [
            d for i, (a, b) in enumerate(zip(saved, current, strict=True)) for d in diff(a, b, f"{path}[{i}]")
        ]
    return [] if saved == current else [f"{path}: {saved!r} -> {current!r}"]


def check_restore(saved: dict | None, current: dict) -> None:
    """Refuses a state saved under another recipe, naming every difference."""
    changes = diff(saved, current)
    if changes:
        raise ValueError(f"the checkpoint was made with a different recipe; changed: {'; '.join(changes)}")
