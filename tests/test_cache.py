"""The disk block cache: exact bytes, damaged entries refetched, eviction, shared by processes."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import pytest

from zephon.io.cache import BlockCache

DATA = random.Random(0).randbytes(300_000)


class Remote:
    """A stand-in for a remote store that counts what it serves."""

    def __init__(self, data: bytes = DATA):
        self.data, self.served, self.requests = data, 0, 0
        self.lock = threading.Lock()

    def fetch(self, a: int, b: int) -> bytes:
        with self.lock:
            self.served += b - a
            self.requests += 1
        return self.data[a:b]


def _ranges(n: int, seed: int):
    rng = random.Random(seed)
    for _ in range(n):
        a = rng.randrange(len(DATA))
        yield a, min(len(DATA), a + rng.randrange(1, 40_000))


def test_every_range_comes_back_exact_and_a_second_read_fetches_nothing(tmp_path):
    cache, remote = BlockCache(str(tmp_path), 1 << 30, 8192), Remote()
    for a, b in _ranges(200, 1):
        assert cache.read("s3://b/k", len(DATA), "v1", a, b, remote.fetch) == DATA[a:b]
    assert cache.read("s3://b/k", len(DATA), "v1", 0, len(DATA), remote.fetch) == DATA
    served = remote.served
    assert served <= len(DATA), "each block is fetched once"
    assert cache.read("s3://b/k", len(DATA), "v1", 0, len(DATA), remote.fetch) == DATA
    assert remote.served == served


def test_a_new_version_of_the_file_never_hits_old_blocks(tmp_path):
    cache, old, new = BlockCache(str(tmp_path), 1 << 30, 8192), Remote(), Remote(DATA[::-1])
    cache.read("u", len(DATA), "v1", 0, 5000, old.fetch)
    assert cache.read("u", len(DATA), "v2", 0, 5000, new.fetch) == DATA[::-1][:5000]


@pytest.mark.parametrize("damage", ["truncate", "flip a byte", "empty"])
def test_a_damaged_entry_is_detected_and_fetched_again(tmp_path, damage):
    cache, remote = BlockCache(str(tmp_path), 1 << 30, 8192), Remote()
    cache.read("u", len(DATA), "v", 0, 8192, remote.fetch)
    [entry] = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".blk")]
    with open(entry, "rb") as f:
        raw = bytearray(f.read())
    if damage == "truncate":
        raw = raw[:1000]
    elif damage == "flip a byte":
        raw[77] ^= 0xFF
    else:
        raw = b""
    with open(entry, "wb") as f:
        f.write(raw)
    before = remote.served
    assert cache.read("u", len(DATA), "v", 0, 8192, remote.fetch) == DATA[:8192]
    assert cache.damaged == 1 and remote.served == before + 8192
    assert cache.read("u", len(DATA), "v", 0, 8192, remote.fetch) == DATA[:8192]
    assert remote.served == before + 8192, "the refetched entry is whole again"


def test_the_cache_is_evicted_down_to_its_size_oldest_first(tmp_path):
    cache, remote = BlockCache(str(tmp_path), 64 * 1024, 4096), Remote()
    for block in range(40):  # 160 KiB of blocks, each read once, oldest first
        a = block * 4096
        assert cache.read("u", len(DATA), "v", a, a + 4096, remote.fetch) == DATA[a : a + 4096]
        time.sleep(0.002)  # distinct modification times: the order eviction goes by
    cache.evict()
    assert cache.size() <= 64 * 1024
    served = remote.served
    newest = 39 * 4096
    assert (
        cache.read("u", len(DATA), "v", newest, newest + 4096, remote.fetch) == DATA[newest : newest + 4096]
    )
    assert remote.served == served, "the most recent block survives eviction"
    assert cache.read("u", len(DATA), "v", 0, 4096, remote.fetch) == DATA[:4096]
    assert remote.served == served + 4096, "the oldest block was evicted"


def test_threads_fetch_each_block_once(tmp_path):
    cache, remote = BlockCache(str(tmp_path), 1 << 30, 8192), Remote()
    threads = [
        threading.Thread(target=lambda: cache.read("u", len(DATA), "v", 0, len(DATA), remote.fetch))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert remote.served == len(DATA)


_READER = """
import random, sys
from zephon.io.cache import BlockCache
directory, source, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(source, "rb").read()
served = 0
def fetch(a, b):
    global served
    served += b - a
    return data[a:b]
cache, rng = BlockCache(directory, 1 << 30, 4096), random.Random(seed)
for _ in range(300):
    a = rng.randrange(len(data))
    b = min(len(data), a + rng.randrange(1, 40_000))
    assert cache.read("u", len(data), "v", a, b, fetch) == data[a:b]
print(served)
"""


def test_several_processes_share_one_cache_folder_safely(tmp_path):
    source = tmp_path / "remote.bin"
    source.write_bytes(DATA)
    cache_dir = tmp_path / "cache"

    def reader(seed: int) -> subprocess.Popen:
        args = [sys.executable, "-c", _READER, str(cache_dir), str(source), str(seed)]
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs = [reader(seed) for seed in range(6)]  # all at once, on one folder
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert not [f for _, _, fs in os.walk(cache_dir) for f in fs if f.endswith(".tmp")]
    again = reader(0)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0 and int(out) == 0, "a later reader finds every block the others cached"


def _entries(directory) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(directory) for f in fs if f.endswith(".blk")]


def test_eviction_passes_over_an_entry_another_process_dropped_meanwhile(tmp_path, monkeypatch):
    cache, remote = BlockCache(str(tmp_path), 16 * 1024, 4096), Remote()
    cache.read("u", len(DATA), "v", 0, 64 * 1024, remote.fetch)  # more than max_bytes
    real, dropped = os.scandir, []

    def listing_then_dropping(path):
        for entry in real(path):
            if entry.name.endswith(".blk") and not dropped:  # a reader found it damaged
                os.unlink(entry.path)
                dropped.append(entry.path)
            yield entry

    monkeypatch.setattr(os, "scandir", listing_then_dropping)
    cache.evict()
    monkeypatch.undo()
    assert dropped and cache.size() <= 16 * 1024


def test_eviction_deletes_what_a_killed_writer_left_once_it_is_old(tmp_path):
    cache = BlockCache(str(tmp_path), 1 << 20, 4096)
    cache.read("u", len(DATA), "v", 0, 4096, Remote().fetch)
    [entry] = _entries(tmp_path)
    old, young = f"{entry}.dead.tmp", f"{entry}.writing.tmp"  # as SIGKILL between write and rename
    for path in (old, young):
        with open(path, "wb") as f:
            f.write(bytes(4096))
    past = time.time() - 24 * 3600
    os.utime(old, (past, past))
    cache.evict()
    assert not os.path.exists(old), "never renamed, never counted: it would stay forever"
    assert os.path.exists(young) and os.path.exists(entry), "a write in progress is left alone"


def test_a_write_that_fails_half_way_leaves_no_part_of_a_block(tmp_path, monkeypatch):
    import errno

    from zephon.io import cache as cache_module

    def disk_full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_module, "_digest", disk_full)  # after the data, before the rename
    cache = BlockCache(str(tmp_path), 1 << 20, 4096)
    with pytest.raises(OSError, match="cannot write the block cache"):
        cache.read("u", len(DATA), "v", 0, 4096, Remote().fetch)
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".tmp")]


@pytest.mark.slow
def test_two_processes_reading_s3_through_one_tiny_cache_match_a_run_without_it(s3, gpt2, tmp_path):
    import json

    import boto3
    from support.processes import S3_PASSES, s3_pipeline_digests

    from zephon.io.cache import _DIGEST, _digest
    from zephon.testing.data import kjv_records

    _, storage = s3
    lines = "".join(json.dumps(r) + "\n" for r in kjv_records()[:6000]).encode()  # ~1.4 MB
    boto3.client("s3", **storage["client_kwargs"]).put_object(
        Bucket="corpus", Key="shared/v.jsonl", Body=lines
    )
    block = 64 << 10
    spec = {
        "path": "s3://corpus/shared/v.jsonl",
        "storage": storage,
        "tokenizer": gpt2,
        "io": {},
        "passes": 2,
    }
    want = s3_pipeline_digests(spec)
    cache_dir = tmp_path / "cache"  # three blocks of a 22-block object: eviction all the time
    spec["io"] = {
        "cache": {"enabled": True, "dir": str(cache_dir), "max_bytes": 3 * block, "block_size": block}
    }
    procs = [
        subprocess.Popen([sys.executable, "-c", S3_PASSES, json.dumps(spec)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        seen = json.loads(out.strip().splitlines()[-1])
        assert seen["runs"] == [want, want] and seen["damaged"] == 0
        assert seen["hits"] > 0 and seen["misses"] > len(lines) // block, "shared, and churned"
    entries = _entries(cache_dir)
    assert 0 < len(entries) <= 3
    for path in entries:
        with open(path, "rb") as f:
            raw = f.read()
        assert raw[-_DIGEST:] == _digest(path, raw[:-_DIGEST]), f"{path} is damaged"
    assert not [f for _, _, fs in os.walk(cache_dir) for f in fs if f.endswith(".tmp")]
