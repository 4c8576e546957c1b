"""Files changed or damaged behind a run's back: a file of numbered lines edited in place with its
size and modification time kept, and a WebDataset tar cut off or damaged at a chosen place."""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Callable

SAMPLED = 64 << 10  # a local file's version samples its first, middle and last 64 KiB


def write_numbered_lines(path: str, n: int = 9000) -> bytes:
    """``n`` JSON lines of numbered documents (9000: about 1 MB), dated 2023-11-14; their bytes."""
    lines = b"".join(
        json.dumps({"text": f"document {i:05d} " + "and the word was " * (i % 7 + 1)}).encode() + b"\n"
        for i in range(n)
    )
    with open(path, "wb") as f:
        f.write(lines)
    os.utime(path, (1_700_000_000, 1_700_000_000))
    return lines


def numbered_pipeline(path: str, gpt2: str, runner: str = "thread", exhausted: str = "stop", **options):
    """A pipeline over the numbered lines at ``path`` (a file or URL): 2 lanes, chunks of 32 KiB,
    rows of 64 tokens, a shuffle of 8, batches of 2."""
    from zephon import Dataset, Pipeline

    return (
        Pipeline(Dataset.from_path("d", path, exhausted=exhausted))
        .options(num_lanes=2, chunk_bytes=32 << 10, runner=runner, **options)
        .tokenize(gpt2, parallelism=2)
        .pack_flat(max_length=64)
        .shuffle(buffer_size=8, seed=1)
        .batch(microbatch_size=2)
    )


def edit_in_place(path: str, start: int, stop: int) -> None:
    """One letter changed inside bytes ``[start, stop)``, in a line that starts inside the range;
    the size and the modification time kept (as an in-place edit with ``touch -r`` would)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    at = data.index(b"word", (start + stop) // 2, stop)
    data[at] = ord("W")
    with open(path, "wb") as f:
        f.write(bytes(data))
    os.utime(path, (1_700_000_000, 1_700_000_000))


def unsampled(size: int, start: int, stop: int) -> bool:
    """Whether bytes ``[start, stop)`` of a file of ``size`` bytes lie outside its sampled blocks."""
    middle = max(0, size // 2 - SAMPLED // 2)
    sampled = [(0, SAMPLED), (middle, middle + SAMPLED), (size - SAMPLED, size)]
    return all(stop <= a or start >= b for a, b in sampled)


def edit_a_replayed_chunk(path: str, pipeline, state: dict):
    """Edit in place (size and time kept) a chunk of ``path`` that a restore of ``pipeline`` from
    ``state`` replays, one outside the sampled blocks, so the file's listed version is unchanged;
    that chunk."""
    plan = pipeline.spec().lane_plan()
    replayed = [
        plan.chunk(dataset, int(lane), k)
        for lane, value in state["lanes"].items()
        for dataset, k, _ in value["digests"]
    ]
    size = os.path.getsize(path)
    chunk = next((c for c in replayed if unsampled(size, c.start, c.stop)), None)
    if chunk is None:
        raise ValueError(f"the state replays no chunk outside the sampled blocks: {replayed}")
    edit_in_place(path, chunk.start, chunk.stop)
    return chunk


def cut_tar(folder: str, samples: list, cut: Callable[[bytes, tarfile.TarInfo], bytes]) -> str:
    """A tar shard of 12 samples in ``folder``, its bytes changed by ``cut(data, member)`` where
    ``member`` is the header of the 18th file (``digit00008.txt`` of ``digits()``); its path."""
    from zephon.testing.images import write_webdataset

    path = write_webdataset(folder, samples[:12], per_shard=12)[0]
    with tarfile.open(path) as tar:
        member = tar.getmembers()[17]
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(cut(data, member))
    return path


def mid_member(data: bytes, member: tarfile.TarInfo) -> bytes:
    """The tar cut off half way through ``member``'s data (a copy or download cut short)."""
    return data[: member.offset_data + member.size // 2]


def declared_size(data: bytes, member: tarfile.TarInfo, size: int) -> bytes:
    """The tar with ``member``'s header declaring ``size`` bytes of data."""
    info = tarfile.TarInfo(member.name)
    info.size, info.mtime = size, 0
    return data[: member.offset] + info.tobuf(tarfile.USTAR_FORMAT) + data[member.offset_data :]


def cache_with_a_copied_entry(folder: str):
    """A block cache of 4 KiB blocks in ``folder`` holding the first two blocks of 16 KiB of data,
    its entry of block 0 overwritten by a copy of block 1's (a valid entry under another key):
    (the cache, the data, a ``fetch(a, b)`` of the data that records each range in ``fetched``,
    ``fetched``, empty)."""
    import shutil

    from zephon.io.cache import BlockCache

    data = bytes(range(256)) * 64
    cache, fetched = BlockCache(folder, 1 << 20, 4096), []

    def fetch(a: int, b: int) -> bytes:
        fetched.append((a, b))
        return data[a:b]

    cache.read("u", len(data), "v1", 0, 8192, fetch)
    shutil.copyfile(cache._path("u", len(data), "v1", 1), cache._path("u", len(data), "v1", 0))
    fetched.clear()
    return cache, data, fetch, fetched
