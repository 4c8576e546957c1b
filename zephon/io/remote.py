"""Remote reads: retries with backoff, range requests, the block cache; `IOConfig` from options.

``io_options`` (a pipeline option; performance only, never part of the recipe)::

    {"cache": {"enabled": False, "dir": "~/.cache/zephon", "max_bytes": 64 << 30,
               "block_size": 4 << 20},
     "retries": {"attempts": 6, "backoff": 0.5, "max_wait": 8.0, "budget": 120.0}}

A transient error (connection refused, timeout, HTTP 408/429/5xx) is retried with exponential
backoff until ``attempts`` or ``budget`` seconds run out; a permanent one (HTTP 403/404, no such
file) fails at once. Either way the error names the URL.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import fsspec
from fsspec.utils import get_protocol

from zephon.errors import with_context
from zephon.fields import check_table
from zephon.io.cache import BlockCache
from zephon.io.chunks import Shard

log = logging.getLogger(__name__)
T = TypeVar("T")

LOCAL = ("file", "local")
_TRANSIENT_NAMES = {
    "ConnectError", "ConnectTimeout", "ReadTimeout", "TimeoutException", "NetworkError",
    "TransportError", "RemoteProtocolError", "EndpointConnectionError", "ConnectTimeoutError",
    "ReadTimeoutError", "ConnectionClosedError", "ClientConnectorError", "ServerDisconnectedError",
    "ClientPayloadError", "FSTimeoutError", "IncompleteRead", "ProtocolError",
}  # fmt: skip


class RemoteUnavailableError(OSError):
    """A remote source kept failing with transient errors for the whole retry budget."""


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    backoff: float = 0.5  # first wait in seconds, doubling after each failure
    max_wait: float = 8.0
    budget: float = 120.0  # seconds from the first attempt after which no retry starts


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = False
    dir: str = "~/.cache/zephon"
    max_bytes: int = 64 << 30
    block_size: int = 4 << 20


@dataclass(frozen=True)
class IOConfig:
    cache: CacheConfig = field(default_factory=CacheConfig)
    retries: RetryPolicy = field(default_factory=RetryPolicy)

    @staticmethod
    def parse(options: dict | None) -> IOConfig:
        options = dict(options or {})
        check_table(options, IOConfig, "io_options")
        built = {}
        for name, cls in (("cache", CacheConfig), ("retries", RetryPolicy)):
            given = options.get(name) or {}
            check_table(given, cls, f"io_options[{name!r}]")
            negative = [k for k, v in given.items() if not isinstance(v, bool | str) and v < 0]
            if negative:
                raise ValueError(f"io_options[{name!r}]: {negative} must not be negative")
            built[name] = cls(**given)
        return IOConfig(**built)


_CACHES: dict[tuple, BlockCache] = {}
_CACHES_LOCK = threading.Lock()


def block_cache(config: CacheConfig) -> BlockCache | None:
    """The process's cache for ``config`` (one per folder), or None when caching is off."""
    if not config.enabled:
        return None
    key = (os.path.expanduser(config.dir), config.max_bytes, config.block_size)
    with _CACHES_LOCK:
        if key not in _CACHES:
            _CACHES[key] = BlockCache(*key)
        return _CACHES[key]


def is_transient(error: BaseException | None) -> bool:
    """Whether retrying may help: network trouble, timeouts, HTTP 408, 429 and 5xx. A "not
    found" caused by a network failure (as fsspec's HTTP filesystem reports one) is transient."""
    for _ in range(6):
        if error is None:
            return False
        status = http_status(error)
        if status is not None:
            return status in (408, 425, 429) or status >= 500
        if {c.__name__ for c in type(error).__mro__} & _TRANSIENT_NAMES:
            return True
        permanent = isinstance(
            error, FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError
        )
        if not permanent and (isinstance(error, ConnectionError | TimeoutError) or type(error) is OSError):
            return True
        error = error.__cause__ or error.__context__
    return False


def http_status(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    for value in (getattr(response, "status_code", None), getattr(response, "status", None)):
        if isinstance(value, int):
            return value
    return None


def retrying(what: str, fn: Callable[[], T], policy: RetryPolicy) -> T:
    """``fn()``, retried on transient errors within ``policy``; errors name ``what``."""
    start, attempt = time.monotonic(), 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as e:
            if not is_transient(e):
                permanent = _permanent(what, e)
                if permanent is e:
                    raise
                raise permanent from e
            elapsed = time.monotonic() - start
            wait = min(policy.max_wait, policy.backoff * 2 ** (attempt - 1))
            if attempt >= policy.attempts or elapsed + wait > policy.budget:
                raise RemoteUnavailableError(
                    f"{what}: still failing after {attempt} attempts in {elapsed:.1f}s "
                    f"({type(e).__name__}: {e}). Check the network, the endpoint and the "
                    "credentials; io_options={'retries': {...}} sets the retry budget"
                ) from e
            log.warning(
                "zephon: %s failed (%s: %s); retry %d in %.1fs", what, type(e).__name__, e, attempt, wait
            )
            time.sleep(wait)


def _permanent(what: str, error: Exception) -> Exception:
    status = http_status(error)
    if isinstance(error, FileNotFoundError) or status == 404:
        return FileNotFoundError(f"{what}: not found ({type(error).__name__}: {error})")
    if isinstance(error, PermissionError) or status in (401, 403):
        return PermissionError(f"{what}: access denied; check the credentials in storage_options ({error})")
    return with_context(error, what)


class Opener:
    """Opens the shards of one dataset: local files directly, remote ones by range requests."""

    def __init__(self, io: IOConfig, storage_options: dict):
        self.io, self.storage_options = io, storage_options

    def is_remote(self, url: str) -> bool:
        return get_protocol(url) not in LOCAL

    def open(self, shard: Shard):
        if self.is_remote(shard.url):
            return RemoteFile(shard, self)
        return open(shard.url.removeprefix("file://"), "rb")

    @staticmethod
    def decompress(raw, compression: str):
        """A reader of the decompressed bytes of the open file ``raw``."""
        if compression == "gzip":
            return gzip.GzipFile(fileobj=raw, mode="rb")
        if compression == "zstd":
            import zstandard

            return zstandard.ZstdDecompressor().stream_reader(raw, closefd=False)
        raise ValueError(f"unknown compression {compression!r}")

    def filesystem(self, url: str):
        return fsspec.core.url_to_fs(url, **self.storage_options)


class RemoteFile:
    """A read-only, seekable file over range requests, through the block cache if enabled."""

    def __init__(self, shard: Shard, opener: Opener):
        self.shard, self.opener, self.pos, self.closed = shard, opener, 0, False
        self.cache = block_cache(opener.io.cache)
        self._handle = None

    def read(self, n: int = -1) -> bytes:
        stop = self.shard.size if n is None or n < 0 else min(self.shard.size, self.pos + n)
        if stop <= self.pos:
            return b""
        if self.cache is not None:
            s = self.shard
            data = self.cache.read(s.url, s.size, s.version, self.pos, stop, self._fetch)
        else:
            data = self._fetch(self.pos, stop)
        self.pos += len(data)
        return data

    def _fetch(self, start: int, stop: int) -> bytes:
        return retrying(
            f"{self.shard.url} bytes [{start}, {stop})",
            lambda: self._fetch_once(start, stop),
            self.opener.io.retries,
        )

    def _fetch_once(self, start: int, stop: int) -> bytes:
        try:
            if self._handle is None:
                fs, path = self.opener.filesystem(self.shard.url)
                self._handle = fs.open(path, "rb", cache_type="none")  # exactly the bytes asked for
            self._handle.seek(start)
            data = self._handle.read(stop - start)
        except Exception:
            self._close_handle()  # a fresh connection for the next attempt
            raise
        if len(data) != stop - start:
            self._close_handle()
            raise OSError(f"short read: {len(data)} of {stop - start} bytes")
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.shard.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def size(self) -> int:
        return self.shard.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def _close_handle(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(Exception):  # the handle is being dropped anyway
                self._handle.close()
            self._handle = None

    def close(self) -> None:
        self._close_handle()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
