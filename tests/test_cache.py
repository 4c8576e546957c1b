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
