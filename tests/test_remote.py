"""Remote data through the real client code: a fake Hugging Face hub and moto's S3 on 127.0.0.1."""

from __future__ import annotations

import email.utils
import io
import json
import os
import re
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon import Dataset
from zephon.fingerprint import of_dataset
from zephon.io import ChangedFileError, IOConfig, RemoteUnavailableError
from zephon.io.formats import parquet
from zephon.testing.data import kjv_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _records(ds: Dataset, io_config=None) -> list[dict]:
    table = ds.chunks(1, chunk_size=300, chunk_bytes=1 << 16, io=io_config)
    return [r for i in range(len(table)) for r in ds.read(table.chunk(0, i), io_config)]


def _kjv(n: int | None = None) -> list[dict]:
    return kjv_records()[:n] if n else kjv_records()


# -- Hugging Face hub -------------------------------------------------------------------------


def test_hub_split_from_readme_configs_reads_row_groups_by_range_requests(hub):
    ds = Dataset.from_path("bible", "hf://acme/bible/verses/train")
    shards = ds.shards()
    assert [s.url.rsplit("/", 1)[-1] for s in shards] == [
        "train-00000-of-00002.parquet",
        "train-00001-of-00002.parquet",
    ]
    table = ds.chunks(1, chunk_size=250, chunk_bytes=1 << 30)
    hub.stats.reset()
    records = ds.read(table.chunk(0, 7))
    assert records == _kjv()[7 * 250 : 8 * 250]
    assert 0 < hub.stats.bytes_served < shards[0].size / 4, "a chunk must cost a few ranges, not the file"


def test_hub_default_config_and_default_file_layout(hub):
    assert Dataset.from_path("b", "hf://acme/bible/train").shards() == (
        Dataset.from_path("b", "hf://acme/bible/verses/train").shards()
    )
    code = Dataset.from_path("code", "hf://acme/code/train")
    assert len(code.shards()) == 2 and code.file_format().name == "parquet"
    assert all(r["path"].endswith(".py") for r in _records(code))


def test_hub_config_of_another_format_and_folder_configs(hub):
    lines = Dataset.from_path("l", "hf://acme/bible/lines/train")
    assert lines.file_format().name == "jsonl" and _records(lines) == _kjv(3000)
    assert _records(Dataset.from_path("fr", "hf://acme/folders/fr/train")) == _kjv(300)[200:]


def test_hub_data_zephon_cannot_read_comes_from_the_parquet_conversion(hub):
    ds = Dataset.from_path("csv", "hf://acme/csv/train")
    assert ds.shards()[0].url.endswith("/default/train/0000.parquet")  # the conversion's layout
    assert [r["text"] for r in _records(ds)] == [r["text"] for r in _kjv(100)]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("hf://acme/nope/train", r"hf://acme/nope: no such dataset repo on http://127\.0\.0\.1"),
        ("hf://acme/bible/chapters/train", r"no config 'chapters'; the configs are \['verses', 'lines'\]"),
        ("hf://acme/bible/verses/dev", r"no split 'dev'; the splits are \['test', 'train'\]"),
        ("hf://acme/folders/de/train", r"no config 'de'.*folders \['en', 'fr'\]"),
        ("hf://acme/bible", r"hf://ORG/NAME\[/CONFIG\]/SPLIT"),
    ],
)
def test_hub_unknown_repo_config_or_split_lists_what_exists(hub, path, message):
    with pytest.raises(ValueError, match=message):
        Dataset.from_path("x", path).shards()


def test_hub_tokenizer_by_id_then_from_the_local_cache_with_the_hub_down(hub):
    from zephon.io import tokenizer as tokenizers

    tok = tokenizers.load_tokenizer("acme/gpt2")
    assert tok.encode_batch(["Hello world"]) == [[15496, 995]] and tok.eos_id == 50256
    tokenizers._LOADED.clear()
    hub.set_request_hook(lambda *_: (503, {}, b"down"))
    try:
        hub.stats.reset()
        again = tokenizers.load_tokenizer("acme/gpt2")
        assert hub.stats.count() == 0, "a cached tokenizer must not touch the hub"
        assert again.fingerprint == tok.fingerprint
    finally:
        hub.set_request_hook(None)
        tokenizers._LOADED.clear()


def test_hub_tokenizer_unavailable_offline_says_how_to_provide_it(hub, monkeypatch):
    from huggingface_hub import constants

    from zephon.io.tokenizer import load_tokenizer

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as HF_HUB_OFFLINE=1 on a cluster
    with pytest.raises(ValueError, match=r"not in the local Hugging Face cache.*hf download acme/other"):
        load_tokenizer("acme/other")


def test_hub_tokenizer_of_an_unknown_repo_is_explained(hub):
    from zephon.io.tokenizer import load_tokenizer

    with pytest.raises(ValueError, match=r"tokenizer 'acme/nothing': no such repo"):
        load_tokenizer("acme/nothing")


def test_tiktoken_gpt2_encoding_from_its_cache_matches_the_gpt2_bpe(tmp_path, monkeypatch, gpt2):
    from zephon.io.tokenizer import load_tokenizer
    from zephon.testing.data import tiktoken_cache

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", tiktoken_cache(str(tmp_path / "tiktoken")))
    texts = [r["text"] for r in _kjv(200)]
    tik = load_tokenizer("tiktoken:gpt2")
    assert tik.eos_id == 50256 and tik.vocab_size == 50257
    assert tik.encode_batch(texts) == load_tokenizer(gpt2).encode_batch(texts)


def test_tiktoken_encoding_that_cannot_be_loaded_is_explained(tmp_path, monkeypatch):
    from zephon.io.tokenizer import TiktokenTokenizer

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # empty, and no network here
    with pytest.raises(ValueError, match=r"'cl100k_base' could not be loaded.*TIKTOKEN_CACHE_DIR"):
        TiktokenTokenizer("tiktoken:cl100k_base", "cl100k_base")


# -- S3 (moto) --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_corpus(s3):
    import boto3

    server, storage = s3
    client = boto3.client("s3", **storage["client_kwargs"])
    verses = _kjv(6000)
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(verses), buf, row_group_size=400)
    client.put_object(Bucket="corpus", Key="bible/verses.parquet", Body=buf.getvalue())
    lines = "".join(json.dumps(v) + "\n" for v in verses).encode()
    client.put_object(Bucket="corpus", Key="bible/verses.jsonl", Body=lines)
    return server, storage, verses


@pytest.mark.parametrize("name", ["verses.parquet", "verses.jsonl"])
def test_s3_dataset_reads_every_record_once_with_range_requests(s3_corpus, name):
    server, storage, verses = s3_corpus
    ds = Dataset.from_path("s3", f"s3://corpus/bible/{name}", storage_options=storage)
    assert _records(ds) == verses
    table = ds.chunks(1, chunk_size=300, chunk_bytes=1 << 16)
    parquet._ROW_GROUPS.clear()  # decoded row groups are kept: read this one from the store again
    server.reset()
    ds.read(table.chunk(0, 3))
    assert 0 < server.bytes_served < ds.shards()[0].size / 4


def test_s3_glob_lists_shards(s3_corpus):
    _, storage, _ = s3_corpus
    ds = Dataset.from_path("s3", "s3://corpus/bible/*.parquet", storage_options=storage)
    assert [s.url for s in ds.shards()] == ["s3://corpus/bible/verses.parquet"]


def test_s3_missing_object_and_access_denied_name_the_url(s3_corpus):
    _, storage, _ = s3_corpus
    with pytest.raises(FileNotFoundError, match=r"s3://corpus/bible/missing\.jsonl"):
        Dataset.from_path("s3", "s3://corpus/bible/missing.jsonl", storage_options=storage).shards()
    with pytest.raises(PermissionError, match=r"corpus/forbidden/x\.jsonl.*access denied"):
        Dataset.from_path("s3", "s3://corpus/forbidden/x.jsonl", storage_options=storage).shards()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # waits on timeouts or servers by design: seconds
def test_unreachable_host_fails_within_the_retry_budget_with_a_clear_message():
    from zephon.io import IOConfig

    dead = f"http://127.0.0.1:{_closed_port()}"
    storage = {"client_kwargs": {"endpoint_url": dead}, "config_kwargs": {"retries": {"max_attempts": 1}}}
    config = IOConfig.parse({"retries": {"attempts": 3, "backoff": 0.2, "budget": 5.0}})
    ds = Dataset.from_path("s3", "s3://corpus/bible/verses.jsonl", storage_options=storage)
    start = time.monotonic()
    with pytest.raises(
        RemoteUnavailableError, match=r"s3://corpus/bible/verses\.jsonl.*after 3 attempts.*network"
    ):
        ds.shards(config)
    assert time.monotonic() - start < 5.0 + 2.0


def test_unreachable_https_url_fails_within_the_retry_budget():
    from zephon.io import IOConfig

    config = IOConfig.parse({"retries": {"attempts": 2, "backoff": 0.1, "budget": 3.0}})
    url = f"http://127.0.0.1:{_closed_port()}/data/train.jsonl"
    start = time.monotonic()
    with pytest.raises(RemoteUnavailableError, match=r"127\.0\.0\.1.*train\.jsonl.*after 2 attempts"):
        Dataset.from_path("web", url).shards(config)
    assert time.monotonic() - start < 5.0


@pytest.mark.slow  # waits on timeouts or servers by design: seconds
def test_an_s3_store_answering_503_fails_within_the_retry_budget_naming_url_and_budget(tmp_path):
    from support.fakehttp import s3_answering_503

    from zephon.io.chunks import Shard

    server, storage = s3_answering_503(str(tmp_path))
    config = IOConfig.parse({"retries": {"attempts": 100, "backoff": 0.2, "max_wait": 1.0, "budget": 3.0}})
    try:
        start = time.monotonic()
        with pytest.raises(RemoteUnavailableError, match=r"s3://corpus/a\.jsonl.*3 ?s"):
            Dataset.from_path("s3", "s3://corpus/a.jsonl", storage_options=storage).shards(config)
        listing = time.monotonic() - start
        start = time.monotonic()
        with pytest.raises(RemoteUnavailableError, match=r"s3://corpus/b\.jsonl bytes \[0, 10\).*3 ?s"):
            Dataset.from_path("s3", "s3://x/b.jsonl", storage_options=storage).opener(config).open(
                Shard("s3://corpus/b.jsonl", 100, "etag")
            ).read(10)
        reading = time.monotonic() - start
    finally:
        server.stop()
    print(f"\ntime to fail against a 3 s budget: listing {listing:.1f}s, reading {reading:.1f}s")
    assert listing <= 3.0 + 2.0 and reading <= 3.0 + 2.0


# -- files that change during a run ---------------------------------------------------------------


def _reversed_lines(data: bytes) -> bytes:
    return b"".join(reversed(data.splitlines(keepends=True)))


def test_an_s3_object_replaced_by_a_same_size_one_mid_run_fails_the_read_and_spares_the_cache(
    s3_corpus, tmp_path
):
    import boto3

    _, storage, verses = s3_corpus
    client = boto3.client("s3", **storage["client_kwargs"])
    original = "".join(json.dumps(v) + "\n" for v in verses).encode()
    client.put_object(Bucket="corpus", Key="changing/verses.jsonl", Body=original)
    config = IOConfig.parse(
        {"cache": {"enabled": True, "dir": str(tmp_path / "cache"), "block_size": 1 << 12}}
    )
    ds = Dataset.from_path("s3", "s3://corpus/changing/verses.jsonl", storage_options=storage)
    table = ds.chunks(1, chunk_size=300, chunk_bytes=1 << 16, io=config)
    first = ds.read(table.chunk(0, 0), config)
    client.put_object(Bucket="corpus", Key="changing/verses.jsonl", Body=_reversed_lines(original))
    with pytest.raises(ChangedFileError) as caught:
        ds.read(table.chunk(0, 1), config)
    message = str(caught.value)
    print("\n" + message)
    assert "s3://corpus/changing/verses.jsonl changed since the run was planned" in message
    assert ds.shards()[0].version in message and "original file back" in message and "new run" in message
    client.put_object(Bucket="corpus", Key="changing/verses.jsonl", Body=original)
    again = Dataset.from_path("s3", "s3://corpus/changing/verses.jsonl", storage_options=storage)
    assert first == verses[: len(first)] and _records(again, config) == verses


def test_a_412_from_s3_is_not_retried(s3_corpus):
    import boto3

    server, storage, _ = s3_corpus
    client = boto3.client("s3", **storage["client_kwargs"])
    client.put_object(Bucket="corpus", Key="changing/once.jsonl", Body=b'{"text": "a"}\n')
    ds = Dataset.from_path("s3", "s3://corpus/changing/once.jsonl", storage_options=storage)
    shard = ds.shards()[0]
    client.put_object(Bucket="corpus", Key="changing/once.jsonl", Body=b'{"text": "b"}\n')
    server.reset()
    with pytest.raises(ChangedFileError, match="changed since the run was planned"):
        ds.opener().open(shard).read()
    gets = [r for r in server.log if r[0] == "GET" and r[1].endswith("once.jsonl")]
    assert [r[3] for r in gets] == [412]


def test_an_object_of_a_versioned_bucket_is_read_at_its_listed_version(s3):
    import boto3

    _, storage = s3
    client = boto3.client("s3", **storage["client_kwargs"])
    client.create_bucket(Bucket="versioned")
    client.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
    original = b"".join(json.dumps({"text": f"line {i:04d}"}).encode() + b"\n" for i in range(2000))
    client.put_object(Bucket="versioned", Key="d.jsonl", Body=original)
    ds = Dataset.from_path("v", "s3://versioned/d.jsonl", storage_options=storage)
    assert ds.shards()[0].version.startswith("version-id:")
    client.put_object(Bucket="versioned", Key="d.jsonl", Body=_reversed_lines(original))
    assert [r["text"] for r in _records(ds)] == [f"line {i:04d}" for i in range(2000)]


@pytest.fixture
def web(tmp_path):
    from support.fakehttp import FileServer

    server = FileServer(str(tmp_path / "www")).start() if (tmp_path / "www").mkdir() is None else None
    yield server, tmp_path / "www"
    server.stop()


def _rewrite(path, data: bytes, mtime: float) -> None:
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))


def test_an_http_file_without_etag_is_versioned_by_its_contents_and_date_and_never_served_stale(
    web, tmp_path
):
    server, www = web
    lines = b"".join(json.dumps({"text": f"document {i:05d}"}).encode() + b"\n" for i in range(30000))
    _rewrite(www / "d.jsonl", lines, 1_700_000_000)
    config = IOConfig.parse(
        {"cache": {"enabled": True, "dir": str(tmp_path / "cache"), "block_size": 1 << 12}}
    )
    url = server.url + "/d.jsonl"
    ds = Dataset.from_path("web", url)
    version = ds.shards()[0].version
    assert re.fullmatch(r"content:[0-9a-f]{16}@Tue, 14 Nov 2023 22:13:20 GMT", version)
    table = ds.chunks(1, chunk_size=300, chunk_bytes=1 << 14, io=config)
    ds.read(table.chunk(0, 0), config)
    _rewrite(www / "d.jsonl", _reversed_lines(lines), 1_700_000_100)  # same size
    was, now = "@Tue, 14 Nov 2023 22:13:20 GMT'", "'Tue, 14 Nov 2023 22:15:00 GMT'"
    with pytest.raises(
        ChangedFileError, match=rf"d\.jsonl changed since the run was planned: .*{was}.*is {now}"
    ):
        ds.read(table.chunk(0, len(table) - 1), config)
    again = Dataset.from_path("web", url)
    assert again.shards()[0].version != version and of_dataset(again) != of_dataset(ds)
    assert _records(again, config) == [json.loads(x) for x in _reversed_lines(lines).splitlines()]


@pytest.mark.parametrize("dates", [True, False])
def test_an_http_file_replaced_with_its_date_and_size_kept_is_not_served_from_the_cache(web, tmp_path, dates):
    """As ``cp -p`` or ``rsync -t`` replace a file (or a server that sends no date at all): the
    listing's version changes with the contents, so the cache of the old file is not used."""
    server, www = web
    server.dates = dates
    lines = b"".join(json.dumps({"text": f"document {i:05d}"}).encode() + b"\n" for i in range(30000))
    _rewrite(www / "d.jsonl", lines, 1_700_000_000)
    config = IOConfig.parse(
        {"cache": {"enabled": True, "dir": str(tmp_path / "cache"), "block_size": 1 << 12}}
    )
    url = server.url + "/d.jsonl"
    first = Dataset.from_path("web", url)
    assert _records(first, config)[:2] == [{"text": "document 00000"}, {"text": "document 00001"}]
    at = len(lines) // 3  # one digit, well away from the first, middle and last 64 KiB
    changed = lines[:at] + lines[at:].replace(b"document", b"Document", 1)
    _rewrite(www / "d.jsonl", changed, 1_700_000_000)
    second = Dataset.from_path("web", url)
    assert second.shards()[0].version != first.shards()[0].version
    assert _records(second, config) == [json.loads(x) for x in changed.splitlines()]
    assert any(r["text"].startswith("Document") for r in _records(second, config))


# -- the cache --------------------------------------------------------------------------------


def _pass(spec: dict) -> list[str]:
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "remote_pass.py"), json.dumps(spec)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # waits on timeouts or servers by design: seconds
def test_second_pass_over_cached_hub_data_reads_zero_remote_bytes(hub, gpt2, tmp_path):
    spec = {
        "path": "hf://acme/bible/verses/test",
        "tokenizer": gpt2,
        "io": {"cache": {"enabled": True, "dir": str(tmp_path / "cache"), "block_size": 1 << 14}},
    }
    hub.stats.reset()
    first = _pass(spec)
    first_bytes = hub.stats.bytes_served
    hub.stats.reset()
    second = _pass(dict(spec, runner="process"))
    print(f"\nhub bytes read: first pass {first_bytes}, second pass {hub.stats.bytes_served}")
    assert first_bytes > 0 and hub.stats.bytes_served == 0
    assert second == first


def test_second_pass_over_cached_s3_data_reads_zero_remote_bytes(s3_corpus, gpt2, tmp_path):
    server, storage, _ = s3_corpus
    spec = {
        "path": "s3://corpus/bible/verses.jsonl",
        "storage_options": storage,
        "tokenizer": gpt2,
        "io": {"cache": {"enabled": True, "dir": str(tmp_path / "cache")}},
    }
    server.reset()
    first = _pass(spec)
    first_bytes = sum(r[4] for r in server.log if r[0] == "GET" and "verses.jsonl" in r[1])
    server.reset()
    second = _pass(spec)
    again = sum(r[4] for r in server.log if r[0] == "GET" and "verses.jsonl" in r[1])
    print(f"\nS3 object bytes read: first pass {first_bytes}, second pass {again}")
    assert first_bytes > 0 and again == 0 and second == first


# -- the engine's guarantees with remote sources ----------------------------------------------


def test_elastic_resume_with_hub_and_s3_sources_and_a_token_mixture(hub, s3_corpus, gpt2, tmp_path):
    from zephon import MixtureWorkSource, Pipeline
    from zephon.testing import run_job

    _, storage, _ = s3_corpus
    cache = {"cache": {"enabled": True, "dir": str(tmp_path / "cache"), "block_size": 1 << 16}}

    def make(d, r):
        datasets = [
            Dataset.from_path("hub_code", "hf://acme/code/train", exhausted="repeat"),
            Dataset.from_path(
                "s3_bible", "s3://corpus/bible/verses.jsonl", storage_options=storage, exhausted="repeat"
            ),
        ]
        source = MixtureWorkSource(datasets, {"hub_code": 0.5, "s3_bible": 0.5}, unit="tokens", seed=2)
        return (
            Pipeline(source)
            .options(
                num_lanes=4, dp_rank=r, dp_world_size=d, chunk_size=10, chunk_bytes=1 << 15, io_options=cache
            )
            .tokenize(gpt2, parallelism=2)
            .pack_flat(256)
            .shuffle(8, seed=3)
            .batch(2)
        )

    baseline, _ = run_job(make, 1, 10, 1)
    first, state = run_job(make, 4, 4, 1)
    rest, _ = run_job(make, 2, 6, 1, state=state)
    assert {**first, **rest} == baseline


def test_transient_errors_are_retried_and_permanent_ones_are_not():
    from zephon.io.remote import RetryPolicy, retrying

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("peer reset")
        return "ok"

    assert retrying("s3://b/k", flaky, RetryPolicy(attempts=5, backoff=0.01)) == "ok" and len(calls) == 3

    def missing():
        calls.append(1)
        raise FileNotFoundError("nope")

    calls.clear()
    with pytest.raises(FileNotFoundError, match="s3://b/k: not found"):
        retrying("s3://b/k", missing, RetryPolicy(attempts=5, backoff=0.01))
    assert len(calls) == 1


def test_a_one_word_tokenizer_id_is_looked_up_on_the_hub(hub):
    from zephon.io.tokenizer import load_tokenizer

    with pytest.raises(ValueError, match=r"tokenizer 'bert-base-nothing': no such repo"):
        load_tokenizer("bert-base-nothing")


# -- requests at scale: jitter, Retry-After, a cap per process ---------------------------------


class _Answer(Exception):
    """A store's answer as botocore reports it: status and headers."""

    def __init__(self, status: int, headers: dict):
        super().__init__(f"HTTP {status}")
        self.response = {"ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers}}


def test_retries_wait_a_jittered_backoff_and_at_least_what_retry_after_asks():
    from zephon.io.remote import RetryPolicy, retry_wait

    policy = RetryPolicy(backoff=1.0, max_wait=8.0)
    slow_down = _Answer(503, {})
    waits = [retry_wait(3, policy, slow_down) for _ in range(200)]  # backoff 4 s
    assert 2.0 <= min(waits) < 2.5 and 3.5 < max(waits) <= 4.0, "half of it drawn: ranks spread out"
    assert retry_wait(1, policy, _Answer(429, {"retry-after": "7"}), draw=lambda: 0.0) == 7.0
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 < retry_wait(1, policy, _Answer(503, {"retry-after": when})) <= 30
    assert retry_wait(1, policy, _Answer(503, {"retry-after": "soon"}), draw=lambda: 1.0) == 1.0


def test_a_process_has_at_most_max_requests_in_flight_however_many_threads_read(monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from support.inflight import InFlight

    from zephon.io.chunks import Shard
    from zephon.io.remote import Opener, RemoteFile

    counter = InFlight()

    def request(self, start, stop):
        counter.hold()
        return bytes(stop - start)

    monkeypatch.setattr(RemoteFile, "_request", request)
    opener = Opener(IOConfig.parse({"max_requests": 3}), {})
    shard = Shard("s3://corpus/x.jsonl", 1 << 20, "etag")

    def read(i: int) -> bytes:
        f = RemoteFile(shard, opener)
        f.seek(i * 1000)
        return f.read(1000)

    with ThreadPoolExecutor(16) as pool:
        assert all(len(b) == 1000 for b in pool.map(read, range(64)))
    assert counter.most == 3
    assert opener.requests.as_tuple() == (64, 64_000)
    with pytest.raises(ValueError, match=r"max_requests'\] = 0: at least 1"):
        IOConfig.parse({"max_requests": 0})
