"""The files of a dataset in its fingerprint: small, yet able to name the file that changed.

``FileVersions`` is a string (it is saved in the state as one)::

    "<files>:<digest of names>:<digest of everything>:<8 hex digits per group of files>"

Names are relative to the files' common folder. A group is one file for up to 1024 files, else
``ceil(files / 1024)`` consecutive files, so the string stays under 9 KiB for any number of files.
Compared with a saved one, it names (from the current listing) each file, or group of files,
whose size or version changed, or says that files were added, removed or renamed.
"""

from __future__ import annotations

import hashlib
import json

from zephon.io.chunks import Shard

GROUPS = 1024


class FileVersions(str):
    shards: list[Shard]

    @staticmethod
    def of(shards: list[Shard], root: str) -> FileVersions:
        names = [s.url[len(root) :] for s in shards]
        content = [(n, s.size, s.version) for n, s in zip(names, shards, strict=True)]
        groups = "".join(_digest([(s.size, s.version) for s in group])[:8] for group in _groups(shards))
        value = FileVersions(f"{len(shards)}:{_digest(names)}:{_digest(content)}:{groups}")
        value.shards = shards
        return value

    def explain(self, saved) -> list[str]:
        """What changed since ``saved`` (a FileVersions' string), in words."""
        parts, now = str(saved).split(":"), self.split(":")
        if len(parts) != 4 or parts[:2] != now[:2] or len(parts[3]) != len(now[3]):
            count = parts[0] if len(parts) == 4 else "?"
            return [f"files were added, removed or renamed ({count} files then, {len(self.shards)} now)"]
        was, now = parts[3], now[3]
        groups = enumerate(_groups(self.shards))
        changed = [g for i, g in groups if was[8 * i : 8 * i + 8] != now[8 * i : 8 * i + 8]]
        if not changed:  # the groups' digests collided: the overall one did not
            return [f"the contents of {len(self.shards)} files changed"]
        return [_changed(group) for group in changed]


def _changed(group: list[Shard]) -> str:
    if len(group) == 1:
        s = group[0]
        what = f"{s.url} (now {s.size} bytes, version {s.version!r}) changed"
    else:
        what = f"one of the {len(group)} files {group[0].url} ... {group[-1].url} changed"
    return what + " since the checkpoint: put the original back to continue the run, or start a new run"


def _groups(shards: list[Shard]):
    size = max(1, -(-len(shards) // GROUPS))
    for i in range(0, len(shards), size):
        yield shards[i : i + size]


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]
