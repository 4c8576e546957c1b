"""A small, self-contained fake Hugging Face Hub HTTP server for tests.

Serves a local folder through the subset of the Hub HTTP API that huggingface_hub (1.x)
uses for reading: HfFileSystem (ls / glob / find / info / open+read with Range),
hf_hub_download, snapshot_download, HfApi.{model,dataset,repo}_info, list_repo_files,
list_repo_tree, get_paths_info, list_repo_refs, list_repo_commits, file_exists.

Layout of ROOT::

    ROOT/datasets/ORG/NAME/<files...>          revision "main" of dataset ORG/NAME
    ROOT/models/ORG/NAME/<files...>            revision "main" of model ORG/NAME
    ROOT/spaces/ORG/NAME/<files...>            (spaces, rarely needed)
    ROOT/datasets/ORG/NAME@<quoted-rev>/...    any other revision, e.g.
    ROOT/datasets/ORG/NAME@refs%2Fconvert%2Fparquet/CONFIG/SPLIT/0000.parquet
        (<quoted-rev> = urllib.parse.quote(rev, safe=""); the revision must also exist for
         "main" i.e. ROOT/datasets/ORG/NAME/ must exist for the repo to exist)

Use ``revision_dir(root, "dataset", "org/name", "refs/convert/parquet")`` to get that path.

Only stdlib (http.server in a daemon thread). No auth, no writes, no xet.

    with FakeHub(root) as hub:          # binds 127.0.0.1 on a free port
        os.environ["HF_ENDPOINT"] = hub.endpoint   # BEFORE importing huggingface_hub
        ...
        hub.stats.bytes_served          # body bytes served by /resolve/ GETs
        hub.stats.requests              # list of RequestLog
        hub.stats.reset()

Commit shas are deterministic: sha1 over (repo, revision, sorted (path, size, mtime_ns)),
so they change when the files change (which keeps the client's cache honest), and any
such sha is accepted as a revision too (snapshot_download lists the tree by sha).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

__all__ = ["FakeHub", "HubStats", "RequestLog", "revision_dir"]

REPO_TYPES = {"model": "models", "dataset": "datasets", "space": "spaces"}
PLURAL_TO_TYPE = {v: k for k, v in REPO_TYPES.items()}
DEFAULT_REVISION = "main"
# Files reported as LFS (like the real hub does for binary data). ETag = sha256 for those.
DEFAULT_LFS_SUFFIXES = (
    ".parquet",
    ".arrow",
    ".bin",
    ".safetensors",
    ".pt",
    ".pth",
    ".h5",
    ".msgpack",
    ".zip",
    ".gz",
    ".zst",
    ".tar",
    ".npy",
    ".npz",
    ".onnx",
)
FAKE_DATE = "2024-01-01T00:00:00.000Z"


def revision_dir(root: str | os.PathLike, repo_type: str, repo_id: str, revision: str) -> Path:
    """Folder holding `revision` of a repo (``main`` is the plain repo folder)."""
    base = Path(root) / REPO_TYPES[repo_type] / repo_id
    if revision == DEFAULT_REVISION:
        return base
    return base.parent / f"{base.name}@{quote(revision, safe='')}"


@dataclass
class RequestLog:
    method: str
    path: str  # raw request path incl. query
    status: int
    range: str | None
    body_bytes: int  # bytes of the response body actually written


@dataclass
class HubStats:
    requests: list[RequestLog] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, entry: RequestLog) -> None:
        with self.lock:
            self.requests.append(entry)

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()

    @property
    def bytes_served(self) -> int:
        """Body bytes served by file downloads (GET .../resolve/...)."""
        return sum(r.body_bytes for r in self.requests if r.method == "GET" and "/resolve/" in r.path)

    def count(self, method: str | None = None, contains: str = "") -> int:
        return sum(1 for r in self.requests if (method is None or r.method == method) and contains in r.path)


class HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


@dataclass
class _Repo:
    repo_type: str
    repo_id: str
    revision: str  # branch / ref name
    path: Path  # folder of that revision
    sha: str


class _Store:
    """Filesystem-backed repository lookup + metadata with a small hash cache."""

    def __init__(self, root: Path, lfs_suffixes: tuple[str, ...]):
        self.root = root
        self.lfs_suffixes = lfs_suffixes
        self._hash_cache: dict[tuple[str, int, int], tuple[str, str]] = {}
        self._lock = threading.Lock()

    # ---- repos & revisions ----
    def _main_dir(self, repo_type: str, repo_id: str) -> Path:
        return self.root / REPO_TYPES[repo_type] / repo_id

    def revisions(self, repo_type: str, repo_id: str) -> dict[str, Path]:
        main = self._main_dir(repo_type, repo_id)
        revs = {DEFAULT_REVISION: main}
        prefix = main.name + "@"
        if main.parent.is_dir():
            for p in main.parent.iterdir():
                if p.is_dir() and p.name.startswith(prefix):
                    revs[unquote(p.name[len(prefix) :])] = p
        return revs

    def commit_sha(self, repo_type: str, repo_id: str, revision: str, path: Path) -> str:
        h = hashlib.sha1(f"{repo_type}/{repo_id}@{revision}".encode())
        for f in sorted(self.iter_files(path)):
            st = (path / f).stat()
            h.update(f"\0{f}\0{st.st_size}\0{st.st_mtime_ns}".encode())
        return h.hexdigest()

    def get_repo(self, repo_type: str, repo_id: str, revision: str | None) -> _Repo:
        if repo_id.count("/") != 1 or ".." in repo_id.split("/"):
            raise HubError(404, "RepoNotFound", f"Repository {repo_id} not found")
        main = self._main_dir(repo_type, repo_id)
        if not main.is_dir():
            raise HubError(404, "RepoNotFound", f"Repository {repo_type}s/{repo_id} not found")
        revision = revision or DEFAULT_REVISION
        revs = self.revisions(repo_type, repo_id)
        if revision in revs:
            p = revs[revision]
            return _Repo(repo_type, repo_id, revision, p, self.commit_sha(repo_type, repo_id, revision, p))
        if re.fullmatch(r"[0-9a-f]{40}", revision):
            for name, p in revs.items():
                if self.commit_sha(repo_type, repo_id, name, p) == revision:
                    return _Repo(repo_type, repo_id, name, p, revision)
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    # ---- files ----
    @staticmethod
    def iter_files(path: Path):
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            for fn in sorted(filenames):
                yield (Path(dirpath) / fn).relative_to(path).as_posix()

    def safe_join(self, repo: _Repo, path_in_repo: str) -> Path:
        path_in_repo = path_in_repo.strip("/")
        if any(part in ("..", "") for part in path_in_repo.split("/")) and path_in_repo:
            raise HubError(404, "EntryNotFound", f"{path_in_repo} does not exist", repo.sha)
        return repo.path / path_in_repo if path_in_repo else repo.path

    def is_lfs(self, rel: str) -> bool:
        return rel.lower().endswith(self.lfs_suffixes)

    def hashes(self, p: Path) -> tuple[str, str]:
        """(git blob sha1, sha256) of a file, cached on (path, size, mtime)."""
        st = p.stat()
        key = (str(p), st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._hash_cache:
                return self._hash_cache[key]
        g = hashlib.sha1(f"blob {st.st_size}\0".encode())
        s = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                g.update(chunk)
                s.update(chunk)
        out = (g.hexdigest(), s.hexdigest())
        with self._lock:
            self._hash_cache[key] = out
        return out

    def etag(self, rel: str, p: Path) -> str:
        git_sha, sha256 = self.hashes(p)
        return sha256 if self.is_lfs(rel) else git_sha

    def entry(self, repo: _Repo, rel: str, expand: bool = False) -> dict:
        p = repo.path / rel
        if p.is_dir():
            out = {"type": "directory", "oid": hashlib.sha1(f"tree {rel}".encode()).hexdigest(), "path": rel}
        else:
            git_sha, sha256 = self.hashes(p)
            size = p.stat().st_size
            out = {"type": "file", "oid": git_sha, "size": size, "path": rel}
            if self.is_lfs(rel):
                out["lfs"] = {"oid": sha256, "size": size, "pointerSize": 134}
        if expand:
            out["lastCommit"] = {"id": repo.sha, "title": "fake commit", "date": FAKE_DATE}
            if out["type"] == "file":
                out["securityFileStatus"] = {"status": "safe", "avScan": None, "pickleImportScan": None}
        return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    # Silence default stderr logging.
    def log_message(self, format, *args):
        if self.server.verbose:
            super().log_message(format, *args)

    # ---------------- plumbing ----------------
    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        self.send_response(status)
        headers = dict(headers or {})
        headers.setdefault("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        written = 0
        if not head and body:
            self.wfile.write(body)
            written = len(body)
        self._log(status, written)

    def _log(self, status: int, written: int) -> None:
        self.server.stats.add(RequestLog(self.command, self.path, status, self.headers.get("Range"), written))

    def _json(self, obj, status: int = 200, headers: dict | None = None, head: bool = False) -> None:
        body = json.dumps(obj).encode()
        self._send(status, body, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, head)

    def _error(self, err: HubError, head: bool = False) -> None:
        headers = {"X-Error-Message": err.message}
        if err.code:
            headers["X-Error-Code"] = err.code
        if err.commit:
            headers["X-Repo-Commit"] = err.commit
        self._json({"error": err.message}, err.status, headers, head)

    def _read_body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    # ---------------- dispatch ----------------
    def do_HEAD(self):
        self._dispatch(head=True)

    def do_GET(self):
        self._dispatch(head=False)

    def do_POST(self):
        body = self._read_body()
        try:
            m = re.fullmatch(
                r"/api/(models|datasets|spaces)/([^/]+/[^/]+)/paths-info/([^/]+)", urlsplit(self.path).path
            )
            if not m:
                raise HubError(404, None, f"Unknown endpoint POST {self.path}")
            self._paths_info(PLURAL_TO_TYPE[m[1]], unquote(m[2]), unquote(m[3]), body)
        except HubError as e:
            self._error(e)

    def _dispatch(self, head: bool) -> None:
        url = urlsplit(self.path)
        path, query = url.path, parse_qs(url.query)
        hook = self.server.request_hook
        if hook is not None:
            override = hook(self.command, self.path, dict(self.headers))
            if override is not None:  # (status, headers, body) injected by the test
                status, headers, body = override
                self._send(status, body, headers, head)
                return
        try:
            # ---- API (JSON) ----
            if path.startswith("/api/"):
                if path == "/api/agent-harnesses":  # fetched once by huggingface_hub's header builder
                    return self._json({"standardEnvVars": [], "harnesses": {}}, head=head)
                m = re.fullmatch(r"/api/(models|datasets|spaces)/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
                if m:
                    return self._repo_info(
                        PLURAL_TO_TYPE[m[1]], unquote(m[2]), unquote(m[3]) if m[3] else None, query, head
                    )
                m = re.fullmatch(r"/api/(models|datasets|spaces)/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path)
                if m:
                    return self._tree(
                        PLURAL_TO_TYPE[m[1]], unquote(m[2]), unquote(m[3]), unquote(m[4] or ""), query, head
                    )
                m = re.fullmatch(r"/api/(models|datasets|spaces)/([^/]+/[^/]+)/refs", path)
                if m:
                    return self._refs(PLURAL_TO_TYPE[m[1]], unquote(m[2]), head)
                m = re.fullmatch(r"/api/(models|datasets|spaces)/([^/]+/[^/]+)/commits/([^/]+)", path)
                if m:
                    return self._commits(PLURAL_TO_TYPE[m[1]], unquote(m[2]), unquote(m[3]), head)
                raise HubError(404, None, f"Unknown endpoint {self.command} {path}")
            # ---- file download (legacy one-word model ids too, answered "not found") ----
            m = re.fullmatch(r"/(?:(datasets|spaces)/)?([^/]+(?:/[^/]+)?)/resolve/([^/]+)/(.+)", path)
            if m:
                repo_type = PLURAL_TO_TYPE[m[1]] if m[1] else "model"
                return self._resolve(repo_type, unquote(m[2]), unquote(m[3]), unquote(m[4]), head)
            raise HubError(404, None, f"Unknown endpoint {self.command} {path}")
        except HubError as e:
            self._error(e, head)
        except (BrokenPipeError, ConnectionResetError):
            pass

    # ---------------- endpoints ----------------
    def _repo_info(self, repo_type, repo_id, revision, query, head):
        store = self.server.store
        repo = store.get_repo(repo_type, repo_id, revision)
        blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for rel in store.iter_files(repo.path):
            sib = {"rfilename": rel}
            if blobs:
                e = store.entry(repo, rel)
                sib.update(size=e["size"], blobId=e["oid"])
                if "lfs" in e:
                    sib["lfs"] = {"size": e["size"], "sha256": e["lfs"]["oid"], "pointerSize": 134}
            siblings.append(sib)
        info = {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "author": repo_id.split("/")[0],
            "sha": repo.sha,
            "lastModified": FAKE_DATE,
            "createdAt": FAKE_DATE,
            "private": False,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
        }
        if repo_type == "model":
            info["modelId"] = repo_id
        expand = query.get("expand") or query.get("expand[]")
        if expand:  # only the requested properties (+ id), like the hub
            info = {k: v for k, v in info.items() if k in set(expand) | {"id", "_id"}}
        self._json(info, head=head)

    def _tree(self, repo_type, repo_id, revision, path_in_repo, query, head):
        store = self.server.store
        repo = store.get_repo(repo_type, repo_id, revision)
        path_in_repo = path_in_repo.strip("/")
        base = store.safe_join(repo, path_in_repo)
        if not base.is_dir():
            raise HubError(404, "EntryNotFound", f"{path_in_repo} does not exist on {revision}", repo.sha)
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        expand = query.get("expand", ["false"])[0].lower() in ("1", "true")
        entries = []
        if recursive:
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames.sort()
                for name in dirnames + sorted(filenames):
                    entries.append((Path(dirpath) / name).relative_to(repo.path).as_posix())
        else:
            entries = [(p.relative_to(repo.path)).as_posix() for p in sorted(base.iterdir())]
        # "tree first" order like the hub: directories then files
        out = [store.entry(repo, rel, expand) for rel in entries]
        out.sort(key=lambda e: (e["type"] != "directory", e["path"]))
        # Pagination with GitHub-style Link header
        page_size = self.server.page_size if not expand else min(self.server.page_size, 50)
        cursor = int(query.get("cursor", ["0"])[0])
        page = out[cursor : cursor + page_size]
        headers = {}
        if cursor + page_size < len(out):
            q = f"recursive={recursive!s}&expand={expand!s}&cursor={cursor + page_size}"
            next_url = f"{self.server.endpoint}{urlsplit(self.path).path}?{q}"
            headers["Link"] = f'<{next_url}>; rel="next"'
        self._json(page, headers=headers, head=head)

    def _paths_info(self, repo_type, repo_id, revision, body: bytes):
        store = self.server.store
        repo = store.get_repo(repo_type, repo_id, revision)
        ctype = self.headers.get("Content-Type", "")
        if "json" in ctype:
            data = json.loads(body or b"{}")
            paths, expand = data.get("paths", []), bool(data.get("expand", False))
        else:
            form = parse_qs(body.decode())
            paths = form.get("paths", [])
            expand = form.get("expand", ["False"])[0].lower() in ("1", "true")
        out = []
        for p in paths:
            p = p.strip("/")
            try:
                full = store.safe_join(repo, p)
            except HubError:
                continue
            if p and full.exists():  # missing paths are silently ignored (like the hub)
                out.append(store.entry(repo, p, expand))
        self._json(out)

    def _refs(self, repo_type, repo_id, head):
        store = self.server.store
        store.get_repo(repo_type, repo_id, None)
        branches, converts, tags = [], [], []
        for name, p in store.revisions(repo_type, repo_id).items():
            sha = store.commit_sha(repo_type, repo_id, name, p)
            if name.startswith("refs/convert/"):
                converts.append({"name": name[len("refs/convert/") :], "ref": name, "targetCommit": sha})
            elif name.startswith("refs/tags/"):
                tags.append({"name": name[len("refs/tags/") :], "ref": name, "targetCommit": sha})
            elif name.startswith("refs/pr/"):
                continue
            else:
                branches.append({"name": name, "ref": f"refs/heads/{name}", "targetCommit": sha})
        self._json({"branches": branches, "converts": converts, "tags": tags, "pullRequests": []}, head=head)

    def _commits(self, repo_type, repo_id, revision, head):
        repo = self.server.store.get_repo(repo_type, repo_id, revision)
        self._json(
            [
                {
                    "id": repo.sha,
                    "authors": [{"user": "fakehub"}],
                    "date": FAKE_DATE,
                    "title": "fake commit",
                    "message": "",
                }
            ],
            head=head,
        )

    def _resolve(self, repo_type, repo_id, revision, path_in_repo, head):
        store = self.server.store
        repo = store.get_repo(repo_type, repo_id, revision)
        full = store.safe_join(repo, path_in_repo)
        if not full.is_file():
            raise HubError(404, "EntryNotFound", f"{path_in_repo} does not exist on {revision}", repo.sha)
        size = full.stat().st_size
        etag = store.etag(path_in_repo, full)
        headers = {
            "X-Repo-Commit": repo.sha,
            "ETag": f'"{etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'inline; filename="{Path(path_in_repo).name}"',
        }
        if store.is_lfs(path_in_repo):
            headers["X-Linked-Etag"] = f'"{etag}"'
            headers["X-Linked-Size"] = str(size)
        start, end = 0, size - 1
        status = 200
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", rng)
            if not m or (m[1] == "" and m[2] == ""):
                raise HubError(416, None, f"Unsupported Range {rng}")
            if m[1] == "":  # suffix range: last N bytes
                start, end = max(0, size - int(m[2])), size - 1
            else:
                start = int(m[1])
                end = min(int(m[2]), size - 1) if m[2] else size - 1
            if start >= size or start > end:
                self._send(416, b"", {**headers, "Content-Range": f"bytes */{size}"}, head)
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = end - start + 1 if size else 0
        headers["Content-Length"] = str(length)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        written = 0
        if not head:
            with open(full, "rb") as f:
                f.seek(start)
                remaining = length
                while remaining > 0:
                    chunk = f.read(min(1 << 16, remaining))
                    if not chunk:
                        break
                    try:
                        self.wfile.write(chunk)
                    except (BrokenPipeError, ConnectionResetError):
                        break
                    written += len(chunk)
                    remaining -= len(chunk)
        self._log(status, written)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    store: _Store
    stats: HubStats
    endpoint: str
    page_size: int
    verbose: bool
    request_hook = None


class FakeHub:
    """Fake HF Hub on 127.0.0.1:<free port>, serving `root` (see module docstring)."""

    def __init__(
        self,
        root: str | os.PathLike,
        host: str = "127.0.0.1",
        port: int = 0,
        page_size: int = 1000,
        lfs_suffixes: tuple[str, ...] = DEFAULT_LFS_SUFFIXES,
        verbose: bool = False,
    ):
        self.root = Path(root)
        self._server = _Server((host, port), _Handler)
        self._server.store = _Store(self.root, lfs_suffixes)
        self._server.stats = HubStats()
        self._server.page_size = page_size
        self._server.verbose = verbose
        self.endpoint = f"http://{host}:{self._server.server_address[1]}"
        self._server.endpoint = self.endpoint
        self._thread: threading.Thread | None = None

    @property
    def stats(self) -> HubStats:
        return self._server.stats

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def set_request_hook(self, hook) -> None:
        """hook(method, raw_path, headers) -> None or (status, headers, body): inject failures."""
        self._server.request_hook = hook

    def revision_dir(self, repo_type: str, repo_id: str, revision: str) -> Path:
        return revision_dir(self.root, repo_type, repo_id, revision)

    def start(self) -> FakeHub:
        self._thread = threading.Thread(target=self._server.serve_forever, name="fakehub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":  # python fakehub.py ROOT [PORT]
    import sys
    import time

    hub = FakeHub(sys.argv[1], port=int(sys.argv[2]) if len(sys.argv) > 2 else 0, verbose=True).start()
    print(f"HF_ENDPOINT={hub.endpoint}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        hub.stop()
