"""Tokenizers by id: a local ``tokenizer.json`` or its folder (Hugging Face ``tokenizers``).

A tokenizer is loaded once per process and shared by its threads (encoding releases the GIL).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass

from tokenizers import Tokenizer

_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "[CLS]")


@dataclass
class TextTokenizer:
    """A loaded tokenizer: batched encoding, its special tokens and a content fingerprint."""

    tokenizer_id: str
    backend: Tokenizer
    eos_id: int | None
    bos_id: int | None
    fingerprint: str

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        fast = getattr(self.backend, "encode_batch_fast", None) or self.backend.encode_batch
        return [e.ids for e in fast(texts, add_special_tokens=False)]


_LOADED: dict[str, TextTokenizer] = {}
_LOCK = threading.Lock()


def load_tokenizer(tokenizer_id: str) -> TextTokenizer:
    """The tokenizer for ``tokenizer_id``, loaded once per process."""
    with _LOCK:
        if tokenizer_id not in _LOADED:
            _LOADED[tokenizer_id] = _load(tokenizer_id)
        return _LOADED[tokenizer_id]


def _load(tokenizer_id: str) -> TextTokenizer:
    path = os.path.expanduser(tokenizer_id)
    if os.path.isdir(path):
        folder, file = path, os.path.join(path, "tokenizer.json")
        if not os.path.isfile(file):
            raise ValueError(f"tokenizer folder {tokenizer_id} has no tokenizer.json")
    elif os.path.isfile(path):
        folder, file = os.path.dirname(path), path
    else:
        raise ValueError(
            f"tokenizer {tokenizer_id!r} not found: give a tokenizer.json file or a folder that holds one"
        )
    return from_files(tokenizer_id, file, os.path.join(folder, "tokenizer_config.json"))


def from_files(tokenizer_id: str, tokenizer_json: str, config_json: str | None) -> TextTokenizer:
    with open(tokenizer_json, "rb") as f:
        raw = f.read()
    backend = Tokenizer.from_str(raw.decode("utf-8"))
    config = {}
    if config_json and os.path.isfile(config_json):
        with open(config_json) as f:
            config = json.load(f)
    eos = _special_id(backend, config.get("eos_token"), _EOS_NAMES)
    bos = _special_id(backend, config.get("bos_token"), _BOS_NAMES)
    if bos == eos:
        bos = None  # GPT-2 style: one <|endoftext|> separates documents; don't add it twice
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return TextTokenizer(tokenizer_id, backend, eos, bos, digest)


def _special_id(backend: Tokenizer, configured, fallbacks: tuple[str, ...]) -> int | None:
    if isinstance(configured, dict):
        configured = configured.get("content")
    if isinstance(configured, str):
        token_id = backend.token_to_id(configured)
        if token_id is None:
            raise ValueError(f"tokenizer_config names special token {configured!r}, not in vocab")
        return token_id
    for name in fallbacks:
        token_id = backend.token_to_id(name)
        if token_id is not None:
            return token_id
    return None
