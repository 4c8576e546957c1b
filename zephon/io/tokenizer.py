"""Tokenizers by id, loaded once per process and shared by its threads.

``tokenizer_id`` is, in this order of lookup:

- ``tiktoken:NAME``, or a bare tiktoken encoding name (``cl100k_base``, ``o200k_base``,
  ``gpt2``: the same ids as the Hugging Face ``gpt2``): a tiktoken encoding, from tiktoken's
  cache (``TIKTOKEN_CACHE_DIR``) or download;
- a local ``tokenizer.json``, or a folder holding one (and maybe ``tokenizer_config.json``);
- a Hugging Face repo id (``ORG/NAME[@REVISION]``, or a legacy one-word id): its
  ``tokenizer.json`` from the local Hugging Face cache first, then from the hub.

Encoding releases the GIL in every backend, so threads encode in parallel. A ``tokenizer.json``
is encoded by ``fastokens`` where it is installed and verified to give the same ids
(``zephon.io.fast_tokenizer``), else by Hugging Face ``tokenizers``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
import time
from abc import ABC, abstractmethod

import numpy as np

from zephon.io import fast_tokenizer


def flat(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Lists of ids laid end to end: one int32 array, and offsets (int64, ``len(ids) + 1``)."""
    offsets = np.zeros(len(ids) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, ids), np.int64, len(ids)), out=offsets[1:])
    return np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(offsets[-1])), offsets


_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "[CLS]")


class TextTokenizer(ABC):
    """A loaded tokenizer: batched encoding, its special tokens and a content fingerprint."""

    tokenizer_id: str
    eos_id: int | None
    bos_id: int | None
    fingerprint: str
    loaded_in: int  # the process that loaded it

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids as one int32 array, and offsets (int64, ``len(texts) + 1``)."""
        return flat(self.encode_batch(texts))

    @abstractmethod
    def decode(self, ids: list[int]) -> str: ...


class HFTokenizer(TextTokenizer):
    """A Hugging Face ``tokenizers`` tokenizer from a ``tokenizer.json``; ``fast``: encode with
    ``fastokens`` where it is verified exact (False: not even loaded)."""

    def __init__(self, tokenizer_id: str, tokenizer_json: str, config_json: str | None, fast: bool = True):
        from tokenizers import Tokenizer

        with open(tokenizer_json, "rb") as f:
            raw = f.read()
        # same ids, so not in the fingerprint; it loads meanwhile, on a core of its own
        self.fast = fast_tokenizer.load(raw) if fast else None
        if self.fast is not None:  # the two builds side by side, the fast one's begun first
            self.fast.started()
        self.tokenizer_id, self.backend = tokenizer_id, None
        try:
            self.backend = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:  # tokenizers raises a bare Exception that names no file
            raise ValueError(
                f"{tokenizer_json}: not a tokenizer Hugging Face tokenizers can read ({e})"
            ) from None
        finally:  # None: the reference failed to load, and so does this tokenizer
            if self.fast is not None:
                self.fast.attach(self.backend)
        config, config_raw = {}, b""
        if config_json and os.path.isfile(config_json):
            with open(config_json, "rb") as f:
                config_raw = f.read()
            config = json.loads(config_raw)
        self.eos_id = self._special(config.get("eos_token"), _EOS_NAMES)
        bos = self._special(config.get("bos_token"), _BOS_NAMES)
        # GPT-2 style: one <|endoftext|> separates documents; don't add it twice
        self.bos_id = None if bos == self.eos_id else bos
        # the config names the special tokens that tokenize adds: part of what shapes the data
        self.fingerprint = hashlib.sha256(raw + b"\0" + config_raw).hexdigest()[:16]

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def _batch_encoder(self):
        """The backend's batch call: ``encode_batch_fast`` (no offsets) where it has it."""
        return getattr(self.backend, "encode_batch_fast", None) or self.backend.encode_batch

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._batch_encoder()(texts, add_special_tokens=False)]

    def encode_one_thread(self, texts: list[str]) -> list[list[int]]:
        """As ``encode_batch``, on one core: one text a call, as a batch of one, which the
        tokenizers' thread pool cannot split (and without touching ``TOKENIZERS_PARALLELISM``,
        the process's, which other threads read). What the reference encodes while the fast
        backend loads, so that the loading keeps the other core: with the pool, inline, the
        fast backend was ready 0.05 s later and 8M tokens took 5-8% longer end to end."""
        encode = self._batch_encoder()
        return [encode([text], add_special_tokens=False)[0].ids for text in texts]

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self.fast is None:
            return super().encode_flat(texts)
        ids, offsets = self.fast.encode_flat(texts, super().encode_flat, self._flat_one_thread)
        return ids.view(np.int32), offsets

    def _flat_one_thread(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return flat(self.encode_one_thread(texts))

    @property
    def backend_name(self) -> str:
        """``fastokens`` or ``tokenizers``: the backend encoding, once the fast one is loaded."""
        return "fastokens" if self.fast is not None and self.fast.wait() else "tokenizers"

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=False)

    def _special(self, configured, fallbacks: tuple[str, ...]) -> int | None:
        if isinstance(configured, dict):
            configured = configured.get("content")
        if isinstance(configured, str):
            token_id = self.backend.token_to_id(configured)
            if token_id is None:
                raise ValueError(
                    f"tokenizer_config names special token {configured!r}, not in the vocabulary"
                )
            return token_id
        for name in fallbacks:
            token_id = self.backend.token_to_id(name)
            if token_id is not None:
                return token_id
        return None


class TiktokenTokenizer(TextTokenizer):
    """A tiktoken encoding; EOS is its ``<|endoftext|>``."""

    def __init__(self, tokenizer_id: str, name: str):
        import tiktoken

        try:
            self.encoding = tiktoken.get_encoding(name)
        except Exception as e:
            raise ValueError(
                f"tiktoken encoding {name!r} could not be loaded ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}). "
                "Offline, put its files in tiktoken's cache (TIKTOKEN_CACHE_DIR) on a machine "
                "with network first, or give a local tokenizer.json"
            ) from None
        self.tokenizer_id, self.bos_id = tokenizer_id, None
        self.eos_id = self.encoding.eot_token
        ranks = sorted(self.encoding._mergeable_ranks.items(), key=lambda kv: kv[1])
        digest = hashlib.sha256(repr((self.encoding.name, ranks, self.encoding._special_tokens)).encode())
        self.fingerprint = digest.hexdigest()[:16]

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(texts)

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids)


_LOADED: dict[tuple[str, str], TextTokenizer] = {}
_LOCK = threading.Lock()
_ADDED = threading.Condition(_LOCK)  # notified as each tokenizer is loaded
BACKENDS = ("auto", "tokenizers")  # auto: fastokens where verified exact, else tokenizers


def load_tokenizer(tokenizer_id: str, backend: str = "auto") -> TextTokenizer:
    """The tokenizer for ``tokenizer_id``, loaded once per process. ``backend="tokenizers"``
    keeps a ``tokenizer.json`` on Hugging Face ``tokenizers`` (the ids are the same either way)."""
    if backend not in BACKENDS:
        raise ValueError(f"tokenizer backend {backend!r}: expected one of {BACKENDS}")
    with _LOCK:
        if (tokenizer_id, backend) not in _LOADED:
            tokenizer = _load(tokenizer_id, fast=backend == "auto")
            tokenizer.loaded_in = os.getpid()  # (a process worker's may be its fork server's)
            _LOADED[tokenizer_id, backend] = tokenizer
            _ADDED.notify_all()
        return _LOADED[tokenizer_id, backend]


def loading(named) -> bool:
    """Whether the fast backend of a tokenizer ``named`` is loading in this process now."""
    loaded = [_LOADED.get(tuple(n)) for n in named]  # (no lock: it is held for a whole load)
    return any(getattr(t, "fast", None) is not None and not t.fast.ready.is_set() for t in loaded)


def wait_settled(named, timeout: float) -> bool:
    """Wait until each tokenizer ``named`` (``(tokenizer_id, backend)`` pairs, as
    ``WorkOperator.tokenizers`` gives them) is loaded in this process and its fast backend, where
    it has one, ready or off; ``timeout`` seconds in all (and, where a tokenizer's load is under
    way then, until that load returns). Whether they all were."""
    end = time.monotonic() + timeout
    with _ADDED:
        if not _ADDED.wait_for(lambda: all(tuple(n) in _LOADED for n in named), timeout):
            return False
        loaded = [_LOADED[tuple(n)] for n in named]
    fasts = [fast for tok in loaded if (fast := getattr(tok, "fast", None)) is not None]
    return all(fast.ready.wait(max(0.0, end - time.monotonic())) for fast in fasts)


def _load(tokenizer_id: str, fast: bool) -> TextTokenizer:
    if tokenizer_id.startswith("tiktoken:"):
        return TiktokenTokenizer(tokenizer_id, tokenizer_id.removeprefix("tiktoken:"))
    path = os.path.expanduser(tokenizer_id)
    if os.path.isdir(path):
        file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(file):
            raise ValueError(f"tokenizer folder {tokenizer_id} has no tokenizer.json")
        return HFTokenizer(tokenizer_id, file, os.path.join(path, "tokenizer_config.json"), fast)
    if os.path.isfile(path):
        config = os.path.join(os.path.dirname(path), "tokenizer_config.json")
        return HFTokenizer(tokenizer_id, path, config, fast)
    if _is_tiktoken_name(tokenizer_id):
        return TiktokenTokenizer(tokenizer_id, tokenizer_id)
    if tokenizer_id.startswith((".", "/", "~")) or tokenizer_id.endswith(".json"):
        raise ValueError(
            f"tokenizer {tokenizer_id!r} not found: give a tokenizer.json file or its folder, a "
            "Hugging Face repo id ORG/NAME, or a tiktoken encoding (tiktoken:NAME)"
        )
    return _from_hub(tokenizer_id, fast)


def _is_tiktoken_name(name: str) -> bool:
    try:
        import tiktoken
    except ImportError:
        return False
    return name in tiktoken.list_encoding_names()


def _from_hub(tokenizer_id: str, fast: bool) -> TextTokenizer:
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
    )

    repo, _, revision = tokenizer_id.partition("@")

    def fetch(filename: str) -> str:
        try:  # the local cache first: no request at all when it is there
            return hf_hub_download(repo, filename, revision=revision or None, local_files_only=True)
        except LocalEntryNotFoundError:
            return hf_hub_download(repo, filename, revision=revision or None)

    try:
        tokenizer_json = fetch("tokenizer.json")
    except RepositoryNotFoundError:
        raise ValueError(f"tokenizer {tokenizer_id!r}: no such repo on {constants.ENDPOINT}") from None
    except RemoteEntryNotFoundError:
        raise ValueError(
            f"tokenizer {tokenizer_id!r}: the repo has no tokenizer.json (a slow tokenizer?); "
            "convert it with transformers and give the folder"
        ) from None
    except Exception as e:
        raise ValueError(
            f"tokenizer {tokenizer_id!r} is not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}) and the hub ({constants.ENDPOINT}) cannot be reached "
            f"({type(e).__name__}). Provide it offline: download it where there is network "
            f"(hf download {repo} tokenizer.json tokenizer_config.json) and copy the cache "
            "(HF_HOME), or give the path of a local tokenizer.json"
        ) from None
    try:
        config_json = fetch("tokenizer_config.json")
    except Exception:  # optional: special tokens then come from the vocabulary's usual names
        config_json = None
    return HFTokenizer(tokenizer_id, tokenizer_json, config_json, fast)
