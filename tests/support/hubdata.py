"""Example repos for a fake Hugging Face hub, made of real text (KJV verses, Python sources)."""

from __future__ import annotations

import os
import shutil

from support.fakehub import revision_dir
from zephon.testing.data import (
    gpt2_tokenizer_dir,
    kjv_records,
    python_source_documents,
    write_jsonl,
    write_parquet,
)

README_CONFIGS = """---
configs:
- config_name: verses
  default: true
  data_files:
  - split: train
    path: verses/train-*.parquet
  - split: test
    path: verses/test-*.parquet
- config_name: lines
  data_files:
  - split: train
    path: lines/train.jsonl
---
# The King James Bible, by verse
"""


def populate_hub(root: str) -> dict[str, str]:
    """Lays out the repos below under ``root``; returns {what: hf path} for tests.

    - ``acme/bible``: README YAML configs ``verses`` (default; Parquet train/test) and ``lines``
    - ``acme/code``: no YAML, the default ``data/train-0000N-of-00002.parquet`` layout
    - ``acme/folders``: no YAML, one folder per language (``en/``, ``fr/``): a config is a folder
    - ``acme/csv``: CSV only, with a ``refs/convert/parquet`` branch
    - model ``acme/gpt2``: GPT-2's tokenizer.json and tokenizer_config.json
    """
    verses = kjv_records()
    bible = os.path.join(root, "datasets", "acme", "bible")
    os.makedirs(os.path.join(bible, "verses"), exist_ok=True)
    os.makedirs(os.path.join(bible, "lines"), exist_ok=True)
    with open(os.path.join(bible, "README.md"), "w") as f:
        f.write(README_CONFIGS)
    half = len(verses) // 2
    write_parquet(os.path.join(bible, "verses", "train-00000-of-00002.parquet"), verses[:half], 500)
    write_parquet(os.path.join(bible, "verses", "train-00001-of-00002.parquet"), verses[half:-1000], 500)
    write_parquet(os.path.join(bible, "verses", "test-00000-of-00001.parquet"), verses[-1000:], 500)
    write_jsonl(os.path.join(bible, "lines", "train.jsonl"), verses[:3000])

    code = python_source_documents(2 << 20)
    data = os.path.join(root, "datasets", "acme", "code", "data")
    os.makedirs(data, exist_ok=True)
    write_parquet(os.path.join(data, "train-00000-of-00002.parquet"), code[: len(code) // 2], 20)
    write_parquet(os.path.join(data, "train-00001-of-00002.parquet"), code[len(code) // 2 :], 20)

    folders = os.path.join(root, "datasets", "acme", "folders")
    for lang, rows in (("en", verses[:200]), ("fr", verses[200:300])):
        os.makedirs(os.path.join(folders, lang), exist_ok=True)
        write_jsonl(os.path.join(folders, lang, "train.jsonl"), rows)

    csv = os.path.join(root, "datasets", "acme", "csv")
    os.makedirs(csv, exist_ok=True)
    with open(os.path.join(csv, "train.csv"), "w") as f:
        f.write("text\n" + "".join(f'"{v["text"]}"\n' for v in verses[:100]))
    converted = revision_dir(root, "dataset", "acme/csv", "refs/convert/parquet")
    os.makedirs(os.path.join(converted, "default", "train"), exist_ok=True)
    write_parquet(os.path.join(converted, "default", "train", "0000.parquet"), verses[:100], 50)

    model = os.path.join(root, "models", "acme", "gpt2")
    os.makedirs(model, exist_ok=True)
    tok = gpt2_tokenizer_dir(os.path.join(root, "_gpt2"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok, name), os.path.join(model, name))
    shutil.rmtree(os.path.join(root, "_gpt2"))
    return {
        "bible": "hf://acme/bible/verses/train",
        "code": "hf://acme/code/train",
        "tokenizer": "acme/gpt2",
    }
