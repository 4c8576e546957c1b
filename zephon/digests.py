"""The bytes are the run's: each chunk's digest, recorded the first time a run reads the chunk and
checked every time it reads it again.

A file's listed version (its size with an ETag, a VersionId, or a sample of its bytes) catches most
changes, but not a same-size edit outside the sampled blocks whose modification time was kept, nor
a file served over HTTP with neither ETag nor a content that differs where it was sampled. The
digest of what a chunk was read from (``zephon.io.formats.content_digest``: the lines' bytes, a row
range serialized by Arrow, a tar's members) catches any change to it:

- within a run, every chunk a rank reads again (a later epoch of a dataset that repeats, another
  iteration of the run) is checked against the digest recorded when it was first read, whichever
  worker or lane read it;
- across a restore, each lane's state carries the digests of the chunks its checkpointed window
  read (those a restore reads again to replay the window), so a restore that would replay other
  bytes fails by name.

A chunk read before a restore and again in a later epoch after it is held to the file's listed
version only. Cost: hashing about 0.05 ms per MB read (XXH3-64), 8 bytes per chunk of the plan per
rank, and about 35 bytes of state per chunk a lane's window reads (a handful).

A digest names its algorithm (``xxh3:`` and 16 hex digits). States saved before chunk digests
were XXH3 (state version 2) hold 16 hex digits of SHA-256 (1 ms per MB): a restore from one reads
those chunks when its lane starts and checks them by SHA-256 (``ChunkStreams.expect``), and the
replay records their XXH3 as it reads them again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from zephon.io.remote import ChangedFileError


class ChunkDigests:
    """Per dataset, the digest of each chunk (by its index in the dataset's chunk table) as first
    read; 0 where not read yet."""

    def __init__(self, chunks_per_dataset: list[int]):
        self.known = [np.zeros(n, np.uint64) for n in chunks_per_dataset]
        self.lock = threading.Lock()

    def check(self, dataset: int, index: int, digest: str, where: Callable[[], str]) -> None:
        """Record ``digest`` (``xxh3:`` and 16 hex digits) for the chunk, or raise
        ChangedFileError if it was read before with other bytes; ``where()`` names the chunk (its
        file and range)."""
        assert digest.startswith("xxh3:"), f"a chunk digest without its algorithm: {digest!r}"
        value = int(digest[5:], 16) or 1
        with self.lock:
            known = int(self.known[dataset][index])
            if not known:
                self.known[dataset][index] = value
                return
        if known != value:
            raise changed(where(), f"{known:016x}", f"{value:016x}", "the run first read it")


def changed(where: str, before: str, now: str, when: str) -> ChangedFileError:
    """The error for a chunk whose bytes are not those ``when`` (with digest ``before``)."""
    return ChangedFileError(
        f"{where} changed during the run: {when} with digest {before}, and now its bytes have digest "
        f"{now}. The file was edited in place (its size, and its modification time or version, kept). "
        "Put the original file back to continue the run, or start a new run (without this state) on "
        "the new data"
    )
