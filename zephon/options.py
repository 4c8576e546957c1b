"""Pipeline options: what shapes the data, and what only changes speed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

from zephon.fields import check_table
from zephon.io.remote import IOConfig
from zephon.runners import RUNNERS

# Upper bounds, where a larger value would exhaust memory or time before doing anything useful
LIMITS = {"num_lanes": 1 << 16, "prefetch": 1 << 12, "prefetch_bytes": 1 << 40, "read_parallelism": 512,
          "window_rows": 1 << 20, "chunk_size": 1 << 24, "chunk_bytes": 1 << 32}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Options:
    """``num_lanes``: logical streams; rank ``r`` of ``dp_world_size`` owns a contiguous
    ``num_lanes / dp_world_size`` of them. ``chunk_size``: records per chunk (Parquet, Arrow);
    ``chunk_bytes``: bytes per chunk (JSON lines, text; an upper bound for Parquet and Arrow);
    both unset: chosen from each dataset's size and ``num_lanes``. ``window_rows``: rows per
    window, a multiple of the microbatch size; unset: the shuffle buffer rounded up to whole
    microbatches (one microbatch without a shuffle, 64 rows for best-fit packing).
    ``prefetch``: batches each lane prepares ahead of the consumer (beyond the window it hands
    over); ``prefetch_bytes``: the most memory a rank's finished batches may hold ahead of the
    consumer, all lanes together (binding for image batches). ``read_parallelism``:
    workers for reading when no later record operator asks for more. ``worker_timeout``: seconds a
    chunk may stay on the workers before a lane reports a stuck worker (an error naming it)."""

    num_lanes: int = 1
    dp_rank: int = 0
    dp_world_size: int = 1
    runner: str = "thread"
    chunk_size: int | None = None
    chunk_bytes: int | None = None
    window_rows: int | None = None
    prefetch: int = 4
    prefetch_bytes: int = 64 << 20
    read_parallelism: int = 1
    worker_timeout: float = 600.0
    io_options: dict = field(default_factory=dict)

    def __post_init__(self):
        check_table({f.name: getattr(self, f.name) for f in fields(self)}, Options, "options")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type.startswith("int") and value is not None:
                least = 0 if f.name in ("dp_rank", "read_parallelism") else 1
                if value < least:
                    raise ValueError(f"option {f.name} must be >= {least}, got {value}")
                if value > LIMITS.get(f.name, value):
                    raise ValueError(
                        f"option {f.name} = {value} is more than zephon takes ({LIMITS[f.name]})"
                    )
        if not 0 < self.worker_timeout < float("inf"):
            raise ValueError(
                f"option worker_timeout must be a positive number of seconds, got {self.worker_timeout}"
            )
        if self.runner not in RUNNERS:
            raise ValueError(f"option runner={self.runner!r}: expected one of {sorted(RUNNERS)}")
        if self.num_lanes % self.dp_world_size:
            raise ValueError(
                f"num_lanes={self.num_lanes} is not divisible by dp_world_size="
                f"{self.dp_world_size}: every rank must own the same number of lanes; use a "
                f"num_lanes that is a multiple of {self.dp_world_size}, or another dp_world_size"
            )
        if not 0 <= self.dp_rank < self.dp_world_size:
            raise ValueError(f"dp_rank={self.dp_rank} is outside [0, dp_world_size={self.dp_world_size})")
        if not isinstance(self.io_options, dict):
            raise ValueError(f"io_options must be a dict, got {self.io_options!r}")
        IOConfig.parse(self.io_options)  # fails now on a bad key, not in a worker

    def replace(self, **changes) -> Options:
        """These options with ``changes``; an unknown name is refused with the valid ones."""
        check_table(changes, self, "options")  # names the valid keys (dataclasses.replace would not)
        return dataclasses.replace(self, **changes)

    @property
    def io(self) -> IOConfig:
        return IOConfig.parse(self.io_options)

    def owned_lanes(self) -> list[int]:
        per_rank = self.num_lanes // self.dp_world_size
        return list(range(self.dp_rank * per_rank, (self.dp_rank + 1) * per_rank))
