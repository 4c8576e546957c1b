"""Remote reads: retries with backoff, range requests, the block cache; `IOConfig` from options.

``io_options`` (a pipeline option; performance only, never part of the recipe)::

    {"cache": {"enabled": False, "dir": "~/.cache/zephon", "max_bytes": 64 << 30,
               "block_size": 4 << 20},
     "retries": {"attempts": 6, "backoff": 0.5, "max_wait": 8.0, "budget": 120.0},
     "max_requests": 64}

A transient error (connection refused, timeout, HTTP 408/429/5xx, S3's 503 SlowDown) is retried
with exponential backoff, half of each wait drawn at random (so that the ranks of a job that
failed together come back spread out), and never sooner than a Retry-After header asks, until
``attempts`` or ``budget`` seconds run out; a permanent one (HTTP 403/404, no such file) fails at
once. Either way the error names the URL. A process has at most ``max_requests`` remote requests
in flight, whatever its threads. S3 clients make one attempt per call
unless ``storage_options`` set their own retries, so that the budget is the time to fail.

Every range read is bound to the version of the file listed when the run was planned: on S3 by
its VersionId (where the listing has one) or an If-Match on its ETag; over HTTP(S) by comparing
the response's ETag or Last-Modified and size with the listed ones. A file that changed fails
the read with `ChangedFileError` (never retried), so no new bytes reach the run or the cache.
Other stores (``hf://`` paths are pinned to a commit) are read without that check.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from zephon.errors import with_context
from zephon.fields import check_table
from zephon.io.cache import BlockCache
from zephon.io.chunks import Shard
from zephon.io.local_files import LocalFiles, LocalRanges

log = logging.getLogger(__name__)
T = TypeVar("T")

LOCAL = ("file", "local")
_PROTOCOL = re.compile(r"::|://")
_LOCAL_PREFIXES = ("file://", "file:", "local://", "local:")
_TRANSIENT_NAMES = {
    "ConnectError", "ConnectTimeout", "ReadTimeout", "TimeoutException", "NetworkError",
    "TransportError", "RemoteProtocolError", "EndpointConnectionError", "ConnectTimeoutError",
    "ReadTimeoutError", "ConnectionClosedError", "ClientConnectorError", "ServerDisconnectedError",
    "ClientPayloadError", "FSTimeoutError", "IncompleteRead", "ProtocolError",
}  # fmt: skip


class RemoteUnavailableError(OSError):
    """A remote source kept failing with transient errors for the whole retry budget."""


class ChangedFileError(OSError):
    """A remote file is no longer the version listed when the run was planned."""


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
    max_requests: int = 64  # remote requests one process has in flight at once, whatever its threads

    @staticmethod
    def parse(options: dict | None) -> IOConfig:
        options = dict(options or {})
        check_table(options, IOConfig, "io_options")
        most = options.get("max_requests", IOConfig.max_requests)
        if most < 1:
            raise ValueError(f"io_options['max_requests'] = {most}: at least 1 request must be allowed")
        built = {"max_requests": most}
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
        if error is None or isinstance(error, ChangedFileError):
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
    if isinstance(response, dict):  # botocore's ClientError
        value = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return value if isinstance(value, int) else None
    for value in (
        getattr(response, "status_code", None), getattr(response, "status", None),
        getattr(error, "status", None),  # aiohttp's ClientResponseError
    ):  # fmt: skip
        if isinstance(value, int):
            return value
    return None


def _status_in_chain(error: BaseException | None) -> int | None:
    for _ in range(6):
        if error is None:
            return None
        status = http_status(error)
        if status is not None:
            return status
        error = error.__cause__ or error.__context__
    return None


_SLOTS: dict[tuple[int, int], threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


@contextlib.contextmanager
def request_slot(io: IOConfig):
    """Hold one of the process's ``io.max_requests`` slots for a remote request: a process asks
    the store for at most that many things at once, however many threads read."""
    key = (os.getpid(), io.max_requests)
    with _SLOTS_LOCK:
        slots = _SLOTS.setdefault(key, threading.BoundedSemaphore(io.max_requests))
    with slots:
        yield


def retry_wait(attempt: int, policy: RetryPolicy, error: BaseException | None, draw=random.random) -> float:
    """Seconds to wait after failed attempt ``attempt``: the backoff, doubling up to
    ``max_wait``, half of it drawn at random (jitter: the ranks of a job that failed together
    do not come back together), and at least what the store asked in a Retry-After header."""
    backoff = min(policy.max_wait, policy.backoff * 2 ** (attempt - 1))
    wait = backoff / 2 + draw() * backoff / 2
    asked = retry_after(error)
    return wait if asked is None else max(wait, asked)


def retry_after(error: BaseException | None) -> float | None:
    """The seconds an HTTP 429 or 503 answer asked the client to wait (Retry-After: seconds or a
    date), found in the error or its causes; None if none asked."""
    for _ in range(6):
        if error is None:
            return None
        value = _header(error, "retry-after")
        if value is not None:
            try:
                return max(0.0, float(value))
            except ValueError:
                with contextlib.suppress(TypeError, ValueError, IndexError):
                    import email.utils

                    return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
        error = error.__cause__ or error.__context__
    return None


def _header(error: BaseException, name: str) -> str | None:
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # botocore's ClientError: lower-case header names
        return response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(name)
    for headers in (getattr(response, "headers", None), getattr(error, "headers", None)):
        if headers is not None and hasattr(headers, "get"):
            found = headers.get(name) or headers.get(name.title())
            if found is not None:
                return str(found)
    return None


def retrying(what: str, fn: Callable[[], T], policy: RetryPolicy) -> T:
    """``fn()``, retried on transient errors within ``policy`` (see ``retry_wait``); errors
    name ``what``."""
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
            wait = retry_wait(attempt, policy, e)
            if attempt >= policy.attempts or elapsed + wait > policy.budget:
                raise RemoteUnavailableError(
                    f"{what}: still failing after {attempt} attempts in {elapsed:.1f}s "
                    f"({type(e).__name__}: {e}). Check the network, the endpoint and the "
                    f"credentials; the retry budget is {policy.attempts} attempts in "
                    f"{policy.budget:g}s, set by io_options={{'retries': {{...}}}}"
                ) from e
            log.warning(
                "zephon: %s failed (%s: %s); retry %d in %.1fs", what, type(e).__name__, e, attempt, wait
            )
            time.sleep(wait)


def _permanent(what: str, error: Exception) -> Exception:
    if isinstance(error, ChangedFileError):
        return error  # it names the file already
    status = http_status(error)
    if isinstance(error, FileNotFoundError) or status == 404:
        return FileNotFoundError(f"{what}: not found ({type(error).__name__}: {error})")
    if isinstance(error, PermissionError) or status in (401, 403):
        return PermissionError(f"{what}: access denied; check the credentials in storage_options ({error})")
    return with_context(error, what)


_FILESYSTEMS: dict[tuple, object] = {}
_FILESYSTEMS_LOCK = threading.Lock()


LIST_PAGE = 1000  # keys an S3 listing request returns at most (GCS and Azure: the same order)


class Requests:
    """What reading cost the store: requests (a range read, a listing page, a local file's read
    call) and the bytes they brought. Thread-safe; ``add`` from any worker."""

    def __init__(self):
        self.requests, self.bytes, self.lock = 0, 0, threading.Lock()

    def add(self, requests: int, nbytes: int = 0) -> None:
        with self.lock:
            self.requests += requests
            self.bytes += nbytes

    def as_tuple(self) -> tuple[int, int]:
        return self.requests, self.bytes


class Opener:
    """Opens the shards of one dataset: local files directly, remote ones by range requests;
    ``requests`` counts what that costs."""

    def __init__(
        self,
        io: IOConfig,
        storage_options: dict,
        requests: Requests | None = None,
        files: LocalFiles | None = None,
    ):
        self.io, self.storage_options, self.files = io, storage_options, files
        self.requests = requests if requests is not None else Requests()

    def is_remote(self, url: str) -> bool:
        return protocol(url) not in LOCAL

    def open(self, shard: Shard):
        if self.is_remote(shard.url):
            return RemoteFile(shard, self)
        return CountedFile(open(shard.url.removeprefix("file://"), "rb"), self.requests)

    def ranges(self, shard: Shard):
        """A reader of byte ranges of ``shard`` (``seek`` and ``read`` only, as the line formats
        read a chunk): a local file through the descriptors ``files`` keeps open, where the
        opener has them, so that a chunk's read does not open and close its file."""
        if self.files is None or self.is_remote(shard.url):
            return self.open(shard)
        return LocalRanges(self.files, shard.url.removeprefix("file://"), self.requests)

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
        """fsspec's filesystem and path for ``url``; one filesystem per protocol and storage options
        in a process (making one can take a second: a client, a session), even where the options
        turn fsspec's own instance cache off."""
        key = (os.getpid(), protocol(url), json.dumps(self.storage_options, sort_keys=True, default=repr))
        with _FILESYSTEMS_LOCK:
            fs = _FILESYSTEMS.get(key)
        if fs is None:
            fs, path = filesystem(url, self.storage_options)
            with _FILESYSTEMS_LOCK:
                _FILESYSTEMS[key] = fs
                while len(_FILESYSTEMS) > 16:
                    _FILESYSTEMS.pop(next(iter(_FILESYSTEMS)))
            return fs, path
        return fs, fs._strip_protocol(url)


def protocol(url: str) -> str:
    """The protocol of ``url`` as fsspec names it (what precedes its first ``://`` or ``::``; a
    plain path's is "file"), without importing fsspec: a local run never needs it (its import is
    a sixth of a loader's start-up)."""
    found = _PROTOCOL.search(url)
    return url[: found.start()] if found else "file"


def local_file(url: str) -> str | None:
    """The path fsspec's local filesystem names the local file ``url`` by (absolute, without
    ``file://``), or None where ``url`` is not one local file (a folder, a glob, another protocol,
    a chained URL): fsspec lists those. A dataset of local files is thus planned and read
    without importing fsspec."""
    if os.sep != "/" or "::" in url or protocol(url) not in LOCAL or any(c in url for c in "*?["):
        return None
    path = next((url[len(p) :] for p in _LOCAL_PREFIXES if url.startswith(p)), url)
    if path.startswith("~"):
        path = os.path.expanduser(path)
    elif not path.startswith("/"):
        path = os.getcwd() + "/" + ("" if path == "." else path.removeprefix("./"))
    path = path.rstrip("/") or "/"
    return path if os.path.isfile(path) else None


def filesystem(url: str, storage_options: dict):
    """fsspec's filesystem and path for ``url``. An S3 client makes one attempt per call
    (unless ``storage_options`` say otherwise): its hidden retries would overrun the budget."""
    options = dict(storage_options)
    s3 = protocol(url) in ("s3", "s3a")
    if s3:
        options["config_kwargs"] = {"retries": {"total_max_attempts": 1}, **options.get("config_kwargs", {})}
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **options)
    if s3:
        fs.retries = 1  # s3fs's own retry loop (of "SlowDown" answers); not a storage option
    return fs, path


def remote_version(info: dict) -> str:
    """What identifies this version of a remote file, from its listing or response headers:
    ``version-id:`` and its S3 VersionId, else its ETag, blob id or hash (see ``content_version``
    for a file that has none of them), else its modification time; "" if nothing."""
    return strong_version(info) or modified(info)


def strong_version(info: dict) -> str:
    """What names this content of a remote file: its S3 VersionId, ETag, blob id or hash; "" if
    the store tells none (a plain HTTP server, which may send Last-Modified at most)."""
    version_id = info.get("VersionId")
    if version_id and version_id != "null":
        return f"version-id:{version_id}"
    for key in ("ETag", "etag", "blob_id", "md5Hash", "generation"):
        if info.get(key):
            return str(info[key]).strip('"')
    return ""


def modified(info: dict) -> str:
    for key in ("LastModified", "Last-Modified", "mtime", "last_modified"):
        if info.get(key):
            return str(info[key]).strip('"')
    return ""


def content_version(digest: str, info: dict) -> str:
    """The version of a file whose store names no version: ``content:`` the digest of all its
    bytes, then ``@`` its modification time where the store tells one. A modification time alone
    is kept by ``cp -p`` and ``rsync -t``; the digest is not, so a replaced file never matches a
    plan, a checkpoint or the block cache made from the old one."""
    when = modified(info)
    return f"content:{digest}" + (f"@{when}" if when else "")


class RemoteFile:
    """A read-only, seekable file over range requests, through the block cache if enabled."""

    def __init__(self, shard: Shard, opener: Opener):
        self.shard, self.opener, self.pos, self.closed = shard, opener, 0, False
        self.cache = block_cache(opener.io.cache)
        self._fs = self._path = self._handle = None

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
        self.opener.requests.add(1, stop - start)  # a retry's requests are the retry's business
        return retrying(
            f"{self.shard.url} bytes [{start}, {stop})",
            lambda: self._fetch_once(start, stop),
            self.opener.io.retries,
        )

    def _fetch_once(self, start: int, stop: int) -> bytes:
        with request_slot(self.opener.io):
            return self._request(start, stop)

    def _request(self, start: int, stop: int) -> bytes:
        try:
            if self._fs is None:
                self._fs, self._path = self.opener.filesystem(self.shard.url)
            pinned = _PINNED.get(protocol(self.shard.url))
            if pinned is not None:
                data = pinned(self._fs, self._path, self.shard, start, stop)
            else:
                if self._handle is None:  # exactly the bytes asked for
                    self._handle = self._fs.open(self._path, "rb", cache_type="none")
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
        self._fs = self._path = self._handle = None

    def close(self) -> None:
        self._close_handle()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class CountedFile:
    """A local file whose read calls are counted as requests (a shared filesystem pays each).
    ``tail``: the first read past a chunk to finish its last line; here a read costs its bytes
    (a store's costs its request: ``RemoteFile`` reads further at once)."""

    tail = 4 << 10

    def __init__(self, raw, requests: Requests):
        self.raw, self.requests = raw, requests

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.requests.add(1, len(data))
        return data

    def readinto(self, buffer) -> int:
        n = self.raw.readinto(buffer)
        self.requests.add(1, n or 0)
        return n

    def __getattr__(self, name):
        return getattr(self.raw, name)

    def __iter__(self):
        return iter(self.raw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.raw.close()


# -- range reads bound to the listed version ------------------------------------------------------


def _read_s3(fs, path: str, shard: Shard, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of the listed version: by its VersionId, else If-Match its ETag."""
    bucket, key, _ = fs.split_path(path)
    if shard.version.startswith("version-id:"):
        pin = {"VersionId": shard.version.removeprefix("version-id:")}
    else:
        pin = {"IfMatch": f'"{shard.version}"'} if shard.version else {}

    async def get() -> bytes:
        response = await fs._call_s3(
            "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{stop - 1}", **pin
        )
        try:
            return await response["Body"].read()
        finally:
            response["Body"].close()

    try:
        from fsspec.asyn import sync

        return sync(fs.loop, get)
    except Exception as e:
        if _status_in_chain(e) != 412:
            raise
        now, size = "unknown", "unknown"
        with contextlib.suppress(Exception):  # only for the message
            fs.invalidate_cache(path)
            info = fs.info(path)
            now, size = remote_version(info), info["size"]
        raise _changed(shard, now, size) from e


def _read_http(fs, url: str, shard: Shard, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)``, refused if the response's ETag or Last-Modified (the listed
    version) or total size differ from the listing's: HTTP servers need not honour If-Match."""

    async def get():
        session = await fs.set_session()
        kwargs = dict(fs.kwargs)
        headers = {
            **kwargs.pop("headers", {}),
            "Range": f"bytes={start}-{stop - 1}",
            "Accept-Encoding": "identity",
        }
        async with session.get(fs.encode_url(url), headers=headers, **kwargs) as r:
            r.raise_for_status()
            return r.status, r.headers, await r.read()

    from fsspec.asyn import sync

    status, headers, data = sync(fs.loop, get)
    total = headers.get("Content-Range", "/*").rsplit("/", 1)[-1] if status == 206 else str(len(data))
    listed, now = shard.version, remote_version(headers)
    if listed.startswith("content:"):  # no version named by the server: its date, where it sent one
        listed, now = listed.partition("@")[2], modified(headers)
    if (now and listed and now != listed) or (total.isdigit() and int(total) != shard.size):
        raise _changed(shard, now or "unknown", total)
    return data if status == 206 else data[start:stop]  # a server that ignores ranges sends it all


def _changed(shard: Shard, now: str, size) -> ChangedFileError:
    return ChangedFileError(
        f"{shard.url} changed since the run was planned: it was version {shard.version!r} "
        f"({shard.size} bytes) when listed and is {now!r} ({size} bytes) now, so its bytes are not "
        "the ones this run was planned on. Put the original file back to continue the run, or "
        "start a new run (without this state) on the new data"
    )


_PINNED = {"s3": _read_s3, "s3a": _read_s3, "http": _read_http, "https": _read_http}
