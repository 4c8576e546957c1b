"""Datasets: every format planned from metadata into chunks that cover each record once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from zephon import Dataset
from zephon.io import DataError
from zephon.testing import synthetic_documents, write_arrow, write_jsonl, write_parquet, write_text

DOCS = synthetic_documents(437, seed=3)

WRITERS = {
    "data.jsonl": write_jsonl,
    "data.jsonl.gz": write_jsonl,
    "data.jsonl.zst": write_jsonl,
    "data.json": write_jsonl,
    "data.parquet": lambda p, r: write_parquet(p, r, row_group_size=60),
    "data.arrow": lambda p, r: write_arrow(p, r, batch_size=50),
    "stream.arrow": lambda p, r: write_arrow(p, r, batch_size=50, stream=True),
    "data.txt": write_text,
}


def _read_all(ds: Dataset, chunk_size: int, chunk_bytes: int) -> list[dict]:
    table = ds.chunks(1, chunk_size, chunk_bytes)
    return [r for i in range(len(table)) for r in ds.read(table.chunk(0, i))]


@pytest.mark.parametrize("name", sorted(WRITERS))
@pytest.mark.parametrize(("chunk_size", "chunk_bytes"), [(7, 333), (1000, 1 << 20), (1, 97)])
def test_chunks_cover_every_record_exactly_once_in_order(tmp_path, name, chunk_size, chunk_bytes):
    path = WRITERS[name](str(tmp_path / name), DOCS)
    records = _read_all(Dataset.from_path("d", path), chunk_size, chunk_bytes)
    want = [{"text": d["text"]} for d in DOCS] if name.endswith(".txt") else DOCS
    assert records == want


def test_json_lines_are_chunked_by_byte_ranges_without_reading_the_data(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"this is not JSON at all\n" * 1000)  # planning must not parse it
    table = Dataset.from_path("d", str(path)).chunks(1, 1024, 4096)
    assert len(table) == -(-path.stat().st_size // 4096)
    assert table.start[0] == 0 and table.stop[-1] == path.stat().st_size


def test_parquet_chunks_stay_inside_row_groups(tmp_path):
    path = write_parquet(str(tmp_path / "d.parquet"), DOCS, row_group_size=100)
    table = Dataset.from_path("d", path).chunks(1, 30, 1 << 30)
    bounds = set(range(0, 437, 100))
    for a, b in zip(table.start, table.stop, strict=True):
        assert b - a <= 30 and not any(a < x < b for x in bounds)


def test_parquet_chunks_are_bounded_by_bytes_as_well_as_rows(tmp_path):
    import pyarrow.parquet as pq

    long = [{"text": d["text"] * 40} for d in DOCS]
    path = write_parquet(str(tmp_path / "long.parquet"), long, row_group_size=100)
    group = pq.ParquetFile(path).metadata.row_group(0)
    per_row = group.total_byte_size / group.num_rows
    table = Dataset.from_path("d", path).chunks(1, 64, 16 << 10)
    rows = table.stop - table.start
    assert rows.max() < 64 and rows.max() * per_row <= 16 << 10
    assert rows.max() >= (16 << 10) // per_row - 1, "as many rows as fit"


@pytest.mark.parametrize("lanes", [8, 32])
@pytest.mark.parametrize("kind", ["jsonl", "parquet", "jsonl.gz"])
def test_default_chunking_gives_every_lane_data_of_a_small_dataset(tmp_path, gpt2, lanes, kind, monkeypatch):
    from zephon import Pipeline
    from zephon.testing import drain

    monkeypatch.setenv("HOME", str(tmp_path))  # the default cache folder, ~/.cache/zephon, in here
    if kind == "parquet":  # a few hundred rows in a few row groups
        path = write_parquet(str(tmp_path / "d.parquet"), DOCS[:300], row_group_size=128)
    else:  # a few MB of JSON lines (and the same compressed: one file, read by every lane)
        records = [{"text": d["text"] * 12} for d in DOCS] * 8
        path = write_jsonl(str(tmp_path / f"d.{kind}"), records)
    ds = Dataset.from_path("small", path)
    pipeline = Pipeline(ds).options(num_lanes=lanes).tokenize(gpt2).pack_flat(64).batch(2)
    table = ds.chunks(lanes)
    assert len(table) >= lanes
    batches = drain(pipeline, 2 * lanes)  # round-robin: two rounds over the lanes
    assert {b.lane for b in batches} == set(range(lanes)), "every lane delivers"
    assert sum(b.tokens.size for b in batches) > 0
    if kind.endswith(".gz"):
        assert len(os.listdir(tmp_path / ".cache" / "zephon" / "plain")) == 1


def test_folder_and_glob_list_shards_in_sorted_order(tmp_path):
    for i in (2, 0, 1):
        write_jsonl(str(tmp_path / f"p{i}.jsonl"), DOCS[i * 100 : (i + 1) * 100])
    (tmp_path / "README.md").write_text("not data")
    by_folder = Dataset.from_path("d", str(tmp_path))
    by_glob = Dataset.from_path("d", str(tmp_path / "p*.jsonl"))
    assert [os.path.basename(s.url) for s in by_folder.shards()] == [
        "p0.jsonl",
        "p1.jsonl",
        "p2.jsonl",
    ]
    assert by_folder.shards() == by_glob.shards()
    assert _read_all(by_folder, 10, 500) == DOCS[:300]


def test_a_local_file_is_named_as_fsspec_names_it_without_importing_fsspec(tmp_path, monkeypatch):
    """Planning a dataset of local files skips fsspec (its import is a sixth of a loader's start-up),
    so what names such a file must be fsspec's own name for it: a shard's URL is in the recipe."""
    import fsspec

    from zephon.io import dataset, remote

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "sub").mkdir()
    write_jsonl(str(tmp_path / "sub" / "a.jsonl"), DOCS[:10])
    absolute = str(tmp_path / "sub" / "a.jsonl")
    given = ["sub/a.jsonl", "./sub/a.jsonl", "sub/../sub/a.jsonl", "~/sub/a.jsonl", absolute,
             f"file://{absolute}", f"file:{absolute}", f"local://{absolute}"]  # fmt: skip
    for url in given:
        assert remote.protocol(url) == fsspec.utils.get_protocol(url), url
        assert remote.local_file(url) == fsspec.core.url_to_fs(url)[1], url
        with monkeypatch.context() as m:
            m.setattr(dataset, "local_file", lambda url: None)  # listed by fsspec, as before
            by_fsspec = Dataset.from_path("d", url).shards()
        assert Dataset.from_path("d", url).shards() == by_fsspec, url
    # a folder, a glob, a store, a chained URL, no such file: fsspec's to list
    for url in ["sub", "sub/*.jsonl", "sub/a.json[l]", "s3://b/a.jsonl", "simplecache::sub/a.jsonl", "x"]:
        assert remote.local_file(url) is None, url
    for url in ["s3://b/k", "a::b://c", "x://y::z", "plain/path", "http://h/p?q=a::b", "", "::", "c:/x"]:
        assert remote.protocol(url) == fsspec.utils.get_protocol(url), url


def test_a_run_over_local_files_does_not_import_fsspec_or_importlib_metadata(tmp_path, gpt2):
    # both slow a loader's start-up: fsspec (local files need none of it), importlib.metadata (the
    # fast backend's verdict names the versions: zephon.io.fast_tokenizer.installed_version)
    path = write_jsonl(str(tmp_path / "a.jsonl"), DOCS)
    script = (
        "import sys\n"
        "from zephon import Dataset, Pipeline\n"
        "from zephon.testing import take\n"
        f"p = Pipeline(Dataset.from_path('d', {path!r})).options(num_lanes=2).tokenize({gpt2!r})\n"
        "assert len(take(p.pack_flat(64).batch(2), 3)) == 3\n"
        "print([m for m in ('fsspec', 'importlib.metadata') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", "a run over a local file imported these"


def test_columns_limit_the_fields_read(tmp_path):
    path = write_parquet(str(tmp_path / "d.parquet"), DOCS)
    ds = Dataset.from_path("d", path, columns=["text"])
    assert _read_all(ds, 100, 1)[0] == {"text": DOCS[0]["text"]}


def test_malformed_json_line_error_names_the_file_and_the_line(tmp_path):
    lines = [f'{{"text": "doc {i}"}}' for i in range(500)]
    lines[337] = '{"text": "broken'
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    ds = Dataset.from_path("d", str(path))
    with pytest.raises(DataError, match=rf"{path}, line 338: malformed JSON"):
        _read_all(ds, 1, 1000)


def test_a_json_array_file_is_explained(tmp_path):
    path = tmp_path / "array.json"
    path.write_text('[{"text": "a"}, {"text": "b"}]\n')
    with pytest.raises(DataError, match=r"line 1: expected a JSON object.*one object per line"):
        _read_all(Dataset.from_path("d", str(path)), 1, 1000)


def test_missing_path_is_an_error_that_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"dataset 'd': no such file or folder: .*nope\.jsonl"):
        Dataset.from_path("d", str(tmp_path / "nope.jsonl")).shards()


def test_an_empty_dataset_is_an_error_at_plan_time_that_names_the_path(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"dataset 'd' has no records: .*empty\.jsonl"):
        Dataset.from_path("d", str(tmp_path / "empty.jsonl")).chunks(1, 10, 10)


def test_a_folder_without_data_files_is_an_error(tmp_path):
    (tmp_path / "notes.md").write_text("hi")
    with pytest.raises(ValueError, match="no data files found"):
        Dataset.from_path("d", str(tmp_path)).shards()


def test_unknown_suffix_asks_for_a_format(tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"cannot tell the format.*pass format="):
        Dataset.from_path("d", str(tmp_path / "data.csv")).file_format()


def test_explicit_format_reads_a_file_without_a_known_suffix(tmp_path):
    path = tmp_path / "data.log"
    path.write_text('{"text": "a"}\n{"text": "b"}\n')
    ds = Dataset.from_path("d", str(path), format="jsonl")
    assert _read_all(ds, 1, 5) == [{"text": "a"}, {"text": "b"}]


def test_mixed_file_kinds_in_one_dataset_are_refused(tmp_path):
    write_jsonl(str(tmp_path / "a.jsonl"), DOCS[:5])
    write_parquet(str(tmp_path / "b.parquet"), DOCS[:5])
    with pytest.raises(ValueError, match="mixes file kinds"):
        Dataset.from_path("d", str(tmp_path)).file_format()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(name="has space"), "dataset name 'has space' is not valid"),
        (dict(exhausted="loop"), "exhausted='loop'"),
        (dict(format="csv"), "unknown format 'csv'"),
    ],
)
def test_bad_dataset_arguments_are_explained(kwargs, message):
    args = dict(name="d", path="x.jsonl") | kwargs
    with pytest.raises(ValueError, match=message):
        Dataset.from_path(args.pop("name"), args.pop("path"), **args)


def test_a_misspelt_column_is_named_at_plan_time_for_parquet_and_at_read_for_json_lines(tmp_path):
    parquet = write_parquet(str(tmp_path / "d.parquet"), DOCS)
    with pytest.raises(ValueError, match=r"no column\(s\) \['txt'\].*its columns are \['id', 'text'\]"):
        Dataset.from_path("d", parquet, columns=["txt"]).chunks(1, 100, 1)
    jsonl = write_jsonl(str(tmp_path / "d.jsonl"), DOCS)
    with pytest.raises(DataError, match=r"line 1: no column\(s\) \['txt'\] in this record; its fields are"):
        _read_all(Dataset.from_path("d", jsonl, columns=["txt"]), 100, 1 << 20)


@pytest.mark.parametrize("exhausted", ["stop", "repeat"])
def test_a_dataset_of_blank_lines_is_an_error_not_an_empty_or_endless_run(tmp_path, gpt2, exhausted):
    from zephon import Pipeline
    from zephon.testing import drain

    (tmp_path / "blank.jsonl").write_text("\n" * 5000)
    ds = Dataset.from_path("blank", str(tmp_path / "blank.jsonl"), exhausted=exhausted)
    pipeline = Pipeline(ds).options(num_lanes=2, chunk_bytes=500).tokenize(gpt2).pack_flat(16).batch(1)
    with pytest.raises(ValueError, match=r"no usable records"):
        drain(pipeline, 10)


def test_json_lines_read_as_json_loads_reads_each_line(tmp_path):
    import json

    lines = [
        b'{"text": "plain"}', b'  {"text": "spaces around"}  \r', b"\t{\"text\": \"tab\"}", b"",
        b"\x0b\x0c", '{"text": "caf\u00e9 \u4f60\u597d \U0001f44d"}'.encode(), b'{"n": 1e400, "x": NaN}',
        b'{"nested": {"a": [1, 2, {"b": null}]}, "text": "x"}', b"   ", b'{"text": "\\u00e9\\n"}',
    ]  # fmt: skip
    path = tmp_path / "edge.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    want = [json.loads(line) for line in lines if line.strip()]
    got = _read_all(Dataset.from_path("d", str(path)), 1, 1 << 20)
    assert json.dumps(got) == json.dumps(want)
    path.write_bytes(b'{"text": "a"}\n{"text": "b"}, {"text": "c"}\n')  # two values on a line
    with pytest.raises(DataError, match=r"line 2: malformed JSON \(Extra data"):
        _read_all(Dataset.from_path("d", str(path)), 1, 1 << 20)


@pytest.mark.parametrize(
    "text",
    [
        b'{"text": "a"}\n{"text": "b"} {"text": "c"}\n{"text":\n"d"}\n',  # two on a line, one on two
        b'{"text": "a", "x": [1,\n2]}\n{"text": "b"}\n',  # an object across two lines
        b'{"text": "a"}\n\n{"text": "b"}\n',  # a blank line
        b'{"text": "a"}\r\n{"text": "b"}\r\n',  # CRLF
        b'{"text": "a", "n": NaN, "i": -Infinity, "big": 1e400, "tiny": 1e-400}\n',  # what msgspec refuses
        b'{"text": "\\ud800 lone", "pair": "\\ud83d\\udc4d"}\n{"text": "b"}',  # no newline at the end
        b'{"a": 1, "b": 2, "a": 3, "text": "dup", "int": 123456789012345678901234567890}\n',
        '{"text": "caf\u00e9"}\n{"text": "\u00e9"}'.encode(),
        b'{"text": "\xed\xa0\x80"}\n',  # an encoded surrogate: invalid UTF-8, json.loads allows it
        b'{"text": "a"}\n{"text": "b"}\x0b\n',
    ],
)
def test_a_chunk_read_in_one_call_gives_what_json_loads_gives_line_by_line(text):
    import json

    from zephon.io.formats.lines import JsonLinesFormat

    lines = [line for line in text.split(b"\n") if line.strip()]
    try:
        want = [json.loads(line) for line in lines]
    except ValueError:
        want = None  # then the quick path declines, and parse says what is wrong
    got = JsonLinesFormat().parse_all(text, None)
    if want is None:
        assert got is None
    elif got is not None:  # declined is fine: parse reads the lines one by one
        assert repr(got) == repr(want) and [list(r) for r in got] == [list(r) for r in want]


def test_msgspec_and_json_read_the_same_values_on_random_records():
    import json
    import random

    from zephon.io.formats.lines import JsonLinesFormat, _whole_chunk

    rng = random.Random(0)

    def value(depth=0):
        kind = rng.randrange(8 if depth < 3 else 5)
        if kind == 0:
            return rng.randint(-(1 << 70), 1 << 70)
        if kind == 1:
            return rng.uniform(-1e300, 1e300) * rng.choice([1, 1e-300, 1e-10])
        if kind == 2:
            chars = [rng.choice([rng.randint(32, 126), rng.randint(0, 0xD7FF), 0x1F44D, 10, 34, 92])
                     for _ in range(rng.randint(0, 20))]  # fmt: skip
            return "".join(map(chr, chars))
        if kind == 3:
            return rng.choice([True, False, None])
        if kind == 4:
            return rng.random()
        if kind == 5:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {f"k{rng.randint(0, 5)}": value(depth + 1) for _ in range(rng.randint(0, 4))}

    records = [{"text": value(), **{f"f{i}": value() for i in range(rng.randint(0, 3))}} for _ in range(3000)]
    lines = [json.dumps(r, ensure_ascii=rng.random() < 0.5).encode() for r in records]
    data = b"\n".join(lines) + b"\n"
    want = [json.loads(line) for line in lines]
    got = _whole_chunk(data)
    assert got is not None  # the quick path took it
    assert repr(got) == repr(want)
    assert repr(JsonLinesFormat().parse_all(data, ("text",))) == repr([{"text": r["text"]} for r in want])
