"""Local files held open for positional reads (zephon.io.local_files.LocalFiles): a chunk's read does
not open its file again, the bytes are those ``open`` reads, at most ``most`` descriptors are
open, one in use is never closed under its reader, and nothing stays open once a dataset is
dropped."""

from __future__ import annotations

import gc
import os
import pickle
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon import Dataset
from zephon.io import local_files
from zephon.io.local_files import LocalFiles, LocalRanges
from zephon.io.remote import Requests
from zephon.testing import synthetic_documents, write_jsonl


def _is_open(fd: int, path: str) -> bool:
    """Whether descriptor ``fd`` is open on ``path`` (a closed one's number may be reused)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _files(tmp_path, n: int, size: int = 3000) -> list[str]:
    paths = []
    for i in range(n):
        path = tmp_path / f"f{i}.bin"
        path.write_bytes(bytes((i * 7 + j) % 251 for j in range(size)))
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def blob(tmp_path_factory) -> tuple[str, bytes]:
    path = tmp_path_factory.mktemp("blob") / "blob.bin"
    data = os.urandom(20_000)
    path.write_bytes(data)
    return str(path), data


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 21_000), st.integers(-1, 6_000)), min_size=1, max_size=6))
def test_reads_give_the_bytes_open_reads(blob, reads):
    path, data = blob
    files, requests = LocalFiles(), Requests()
    with LocalRanges(files, path, requests) as f, open(path, "rb") as g:
        for pos, n in reads:
            f.seek(pos)
            g.seek(pos)
            assert f.read(n) == g.read(n)
    assert requests.requests == len(reads)
    assert requests.bytes == sum(max(0, min(len(data), p + n if n >= 0 else len(data)) - p) for p, n in reads)


def test_a_read_the_filesystem_splits_is_joined(blob, monkeypatch):
    path, data = blob
    pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, pos: pread(fd, min(n, 7), pos))
    with LocalRanges(LocalFiles(), path, Requests()) as f:
        f.seek(100)
        assert f.read(1000) == data[100:1100]
        f.seek(len(data) - 10)
        assert f.read(1000) == data[-10:]
        assert f.read(5) == b""


def test_at_most_most_are_open_and_the_least_recently_used_closes_first(tmp_path):
    paths, files = _files(tmp_path, 6), LocalFiles()
    files.most = 3
    fds = {}
    for path in paths[:3]:
        with LocalRanges(files, path, Requests()) as f:
            fds[path] = f.file.fd
    with LocalRanges(files, paths[0], Requests()) as f:  # used again: now the most recent
        assert f.file.fd == fds[paths[0]]
    for path in paths[3:5]:
        with LocalRanges(files, path, Requests()) as f:
            fds[path] = f.file.fd
    assert list(files.held) == [paths[0], paths[3], paths[4]]
    assert not _is_open(fds[paths[1]], paths[1]) and not _is_open(fds[paths[2]], paths[2])
    assert all(_is_open(fds[p], p) for p in files.held)


def test_one_in_use_is_closed_only_when_its_reader_is_done(tmp_path):
    paths, files = _files(tmp_path, 5), LocalFiles()
    files.most = 2
    reader = LocalRanges(files, paths[0], Requests())
    fd = reader.file.fd
    for path in paths[1:]:  # pushes paths[0] out while it is read
        with LocalRanges(files, path, Requests()) as f:
            f.read(10)
    assert paths[0] not in files.held and _is_open(fd, paths[0])
    reader.seek(5)
    assert reader.read(4) == Path(paths[0]).read_bytes()[5:9]
    reader.close()
    assert not _is_open(fd, paths[0])


def test_threads_reading_while_files_are_pushed_out_read_the_right_bytes(tmp_path):
    paths, files = _files(tmp_path, 9, 4000), LocalFiles()
    files.most = 2
    contents = {p: Path(p).read_bytes() for p in paths}
    errors, turns = [], threading.Barrier(4)

    def read(seed: int) -> None:
        try:
            for k in range(1500):
                path = paths[(seed * 5 + k * 3) % len(paths)]
                with LocalRanges(files, path, Requests()) as f:
                    pos = (k * 131 + seed) % 3500
                    f.seek(pos)
                    first = f.read(200)
                    if k % 50 == 0:  # all four inside a read at once, while files are pushed out
                        turns.wait(10)
                    rest = f.read(300)
                assert first + rest == contents[path][pos : pos + 500], (path, pos)
        except Exception as e:  # reported below, with the thread's own error
            errors.append(repr(e))

    threads = [threading.Thread(target=read, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a reader still running after 60 s"
    assert not errors, errors[:3]
    assert len(files.held) <= 2


def test_past_the_process_s_budget_a_read_opens_its_file_alone_and_closes_it(tmp_path, monkeypatch):
    paths = _files(tmp_path, 4)
    first, second = LocalFiles(), LocalFiles()
    gc.collect()
    local_files._budget(0)  # counts back what finalizers closed
    monkeypatch.setattr(LocalFiles, "process_most", local_files._OPEN[0] + 2)
    for path in paths[:2]:
        with LocalRanges(first, path, Requests()) as f:
            f.read(1)
    with LocalRanges(second, paths[2], Requests()) as f:
        assert f.read(4) == Path(paths[2]).read_bytes()[:4]
        alone = f.file.fd
    assert list(first.held) == paths[:2] and not second.held
    assert not _is_open(alone, paths[2])
    del first, f
    gc.collect()  # its two are closed and given back to the budget
    with LocalRanges(second, paths[3], Requests()) as f:
        f.read(1)
    assert list(second.held) == [paths[3]] and _is_open(second.held[paths[3]].fd, paths[3])


def test_a_copy_for_a_worker_process_has_none_open_and_reads(tmp_path):
    paths, files = _files(tmp_path, 2), LocalFiles()
    with LocalRanges(files, paths[0], Requests()) as f:
        f.read(3)
    copy = pickle.loads(pickle.dumps(files))
    assert copy.held == {} and files.held
    with LocalRanges(copy, paths[1], Requests()) as f:
        assert f.read(5) == Path(paths[1]).read_bytes()[:5]


def test_dropping_the_files_closes_their_descriptors(tmp_path):
    paths, files = _files(tmp_path, 3), LocalFiles()
    for path in paths:
        with LocalRanges(files, path, Requests()) as f:
            f.read(1)
    fds = [(held.fd, path) for path, held in files.held.items()]
    assert all(_is_open(*fd) for fd in fds)
    del files, f
    gc.collect()
    assert not any(_is_open(*fd) for fd in fds)


def test_a_dataset_opens_each_file_once_for_all_its_chunks_and_reads_every_record(tmp_path, monkeypatch):
    docs = synthetic_documents(400, seed=3)
    path = write_jsonl(str(tmp_path / "d.jsonl"), docs)
    opened = []
    real = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: (opened.append(p), real(p, *a, **k))[1])
    ds = Dataset.from_path("d", path)
    table = ds.chunks(1, 10, 600)
    assert len(table) > 20
    records = [r for i in range(len(table)) for r in ds.read(table.chunk(0, i))]
    assert records == docs
    assert opened.count(path) == 1
    dropped = ds._cache["files"].held[path].fd
    del ds
    gc.collect()
    assert not _is_open(dropped, path)


def test_a_file_that_is_missing_or_a_folder_is_named_as_open_names_it(tmp_path):
    files = LocalFiles()
    with pytest.raises(FileNotFoundError) as missing:
        LocalRanges(files, str(tmp_path / "gone.jsonl"), Requests())
    with pytest.raises(IsADirectoryError) as folder:
        LocalRanges(files, str(tmp_path), Requests())
    assert missing.value.filename == str(tmp_path / "gone.jsonl") and folder.value.filename == str(tmp_path)
    assert not files.held


def test_a_file_replaced_on_disk_is_read_as_it_was_while_open_and_as_it_is_once_reopened(tmp_path):
    paths, files = _files(tmp_path, 3), LocalFiles()
    files.most = 2
    old = Path(paths[0]).read_bytes()
    with LocalRanges(files, paths[0], Requests()) as f:
        assert f.read(8) == old[:8]
    new = tmp_path / "new.bin"
    new.write_bytes(b"N" * len(old))
    os.replace(new, paths[0])
    with LocalRanges(files, paths[0], Requests()) as f:
        assert f.read(8) == old[:8], "the file the run opened"
    for path in paths[1:]:  # push it out
        with LocalRanges(files, path, Requests()) as f:
            f.read(1)
    with LocalRanges(files, paths[0], Requests()) as f:
        assert f.read(8) == b"N" * 8, "reopened: as it is now"


def test_a_dataset_budget_of_none_still_keeps_the_file_being_read(tmp_path):
    paths, files = _files(tmp_path, 3), LocalFiles()
    files.most = 0
    for path in paths:
        with LocalRanges(files, path, Requests()) as f:
            assert f.read(5) == Path(path).read_bytes()[:5]
            fd = f.file.fd
        assert _is_open(fd, path) and list(files.held) == [path]


def test_the_process_budget_comes_back_whatever_closed_the_files(tmp_path):
    gc.collect()
    local_files._budget(0)
    before = local_files._OPEN[0]
    paths, files = _files(tmp_path, 4), LocalFiles()
    files.most = 2
    reader = LocalRanges(files, paths[0], Requests())
    for path in paths[1:]:  # pushed out while read, closed when the reader is done
        with LocalRanges(files, path, Requests()) as f:
            f.read(1)
    assert local_files._OPEN[0] == before + 3
    reader.close()
    assert local_files._OPEN[0] == before + 2
    reader.file = files.held[paths[3]]
    reader.file.close()
    reader.file.close()  # a second close does nothing (its number may be another file's by then)
    assert reader.file.fd == -1 and local_files._OPEN[0] == before + 1
    del files, reader, f
    gc.collect()  # the finalizer's count comes back at the next change
    local_files._budget(0)
    assert local_files._OPEN[0] == before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_starts_with_none_open_even_where_a_thread_held_the_locks(tmp_path):
    paths, files = _files(tmp_path, 2), LocalFiles()
    with LocalRanges(files, paths[0], Requests()) as f:
        f.read(1)
    parent_fd = files.held[paths[0]].fd
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with files.lock, local_files._OPEN_LOCK:
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: the thread that holds the locks is not here
        ok = not files.held and not _is_open(parent_fd, paths[0])
        with LocalRanges(files, paths[1], Requests()) as f:
            ok = ok and f.read(4) == Path(paths[1]).read_bytes()[:4]
        os._exit(0 if ok else 1)
    release.set()
    thread.join()
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on a lock its parent's thread held")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert _is_open(parent_fd, paths[0]), "the parent's own stay open"
