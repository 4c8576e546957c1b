"""The limit: the tokenizer alone, on the benchmark's documents held in memory (no I/O, no
packing, no batches), one ``encode_batch`` call per 1,024 documents, until enough tokens."""

from __future__ import annotations

import itertools
import json
import os
import time

from benchmarks.peers.common import Setup


def _texts(setup: Setup) -> list[str]:
    """Each dataset's documents once (a file written ``setup.copies`` times over holds them that
    many times: the rate is over the same documents, in the same order, either way)."""
    texts = []
    for path in setup.files.values():
        with open(path, "rb") as f:  # the copies are byte for byte the same: the first one only
            once = f.read(os.path.getsize(path) // setup.copies)
        texts += [json.loads(line)["text"] for line in once.splitlines() if line.strip()]
    return texts


def rate(setup: Setup, backend: str, tokens: int) -> dict:
    texts = _texts(setup)
    if backend == "hf":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(setup.tokenizer_json)

        def encode(batch):
            return sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False))
    else:
        import fastokens

        tok = fastokens.Tokenizer.from_file(setup.tokenizer_json)

        def encode(batch):
            return len(tok.encode_batch_flat(batch)[0]) // 4

    done, start = 0, time.perf_counter()
    for i in itertools.cycle(range(0, len(texts), 1024)):
        done += encode(texts[i : i + 1024])
        if done >= tokens:
            break
    return {"tokens_per_s": done / (time.perf_counter() - start), "first_batch_s": None, "peak_rss": None}
