"""Plain copies of compressed line files, so that more than one lane can read them.

A ``.jsonl.gz`` or ``.jsonl.zst`` file cannot be read from the middle. Its dataset decompresses
it once, at planning, into ``<cache dir>/plain/`` (the io_options cache folder, whether or not
the block cache is on) and then plans and reads that copy by byte ranges like any plain file.
A copy is keyed by the file's URL, size and version (modification time for local files), so a
changed file gets a new copy; it is written to a temporary name and renamed into place, so
concurrent ranks and processes see a whole copy or none.
"""

from __future__ import annotations

import hashlib
import os
import uuid

from zephon.io.chunks import Shard
from zephon.io.formats import DataError
from zephon.io.remote import Opener
from zephon.progress import Progress

_BLOCK = 4 << 20


def plain_copy(shard: Shard, compression: str, opener: Opener, cache_dir: str) -> Shard:
    """The decompressed copy of ``shard`` as a local shard, made if it does not exist yet."""
    version = shard.version
    if not opener.is_remote(shard.url):
        version = str(os.stat(shard.url.removeprefix("file://")).st_mtime_ns)
    key = hashlib.sha256(f"{shard.url}\0{shard.size}\0{version}\0{compression}".encode()).hexdigest()
    folder = os.path.join(os.path.expanduser(cache_dir), "plain")
    path = os.path.join(folder, key[:32] + ".plain")
    if not os.path.exists(path):
        try:
            os.makedirs(folder, exist_ok=True)
            _decompress(shard, compression, opener, path)
        except OSError as e:
            raise OSError(
                f"cannot decompress {shard.url} into {folder} ({e}); set io_options "
                '{"cache": {"dir": ...}} to a writable folder with room for the uncompressed data'
            ) from e
    return Shard(path, os.path.getsize(path), "")


def _decompress(shard: Shard, compression: str, opener: Opener, path: str) -> None:
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    progress = Progress(f"decompressing {shard.url} into the local cache", shard.size >> 20, "MB of input")
    try:
        with opener.open(shard) as raw, opener.decompress(raw, compression) as src, open(tmp, "wb") as out:
            done = 0
            while True:
                block = src.read(_BLOCK)
                if not block:
                    break
                out.write(block)
                now = raw.tell() >> 20
                if now > done:
                    progress.update(now - done)
                    done = now
        os.replace(tmp, path)
    except (EOFError, ValueError) as e:  # gzip.BadGzipFile is an OSError; zstd's errors ValueErrors
        _remove(tmp)
        raise DataError(f"{shard.url}: the {compression} data is damaged or truncated ({e})") from None
    except BaseException as e:
        _remove(tmp)
        if type(e).__name__ in ("BadGzipFile", "ZstdError"):
            raise DataError(f"{shard.url}: the {compression} data is damaged ({e})") from None
        raise


def _remove(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
