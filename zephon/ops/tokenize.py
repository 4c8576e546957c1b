"""Tokenize: records -> documents (one flat token array per chunk). Stateless."""

from __future__ import annotations

import numpy as np

from zephon.io.tokenizer import TextTokenizer, load_tokenizer
from zephon.ops.base import WorkOperator
from zephon.ops.containers import Docs, RecordBlock

# One document's text at most, in characters (8 Mi: longer than any book): a tokenizer needs
# about 160 bytes of memory per character of one text, and a single document this long is
# almost always a broken record.
MAX_TEXT = 8 << 20
_MISSING = object()


class Tokenize(WorkOperator):
    """Encodes ``record[field]`` in one batched call per chunk.

    ``backend``: ``"auto"`` encodes a ``tokenizer.json`` with fastokens where it is verified to
    give the same ids, ``"tokenizers"`` always with Hugging Face ``tokenizers``; the ids are the
    same, so it is a performance setting, not part of the recipe.

    Appends the tokenizer's EOS to every document (``add_eos``) and prepends its BOS where it
    defines one distinct from EOS (``add_bos``). A document with no tokens is skipped and counted.
    """

    kind = "tokenize"
    takes = ("records",)
    gives = "docs"

    def __init__(
        self,
        tokenizer_id: str,
        field: str = "text",
        add_bos: bool | None = None,
        add_eos: bool = True,
        parallelism: int | None = None,
        backend: str = "auto",
    ):
        super().__init__(parallelism)
        self.tokenizer_id, self.field, self.backend = str(tokenizer_id), field, backend
        tok = self.tokenizer()  # fail now, not in a worker, if it can't be loaded
        if add_eos and tok.eos_id is None:
            raise ValueError(
                f"tokenizer {tokenizer_id!r} defines no EOS token: pass add_eos=False or use a "
                "tokenizer whose tokenizer_config.json names eos_token"
            )
        if add_bos and tok.bos_id is None:
            raise ValueError(
                f"tokenizer {tokenizer_id!r} defines no BOS token distinct from its EOS (documents are "
                "already separated by EOS); pass add_bos=False"
            )
        self.add_eos = bool(add_eos)
        self.add_bos = tok.bos_id is not None if add_bos is None else bool(add_bos)

    def tokenizer(self) -> TextTokenizer:
        return load_tokenizer(self.tokenizer_id, self.backend)

    def params(self) -> dict:
        return {
            "tokenizer": self.tokenizer().fingerprint,
            "field": self.field,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
        }

    def work(self, block: RecordBlock) -> Docs:
        tok = self.tokenizer()
        texts, bad = [], {}
        for i, r in enumerate(block.records):
            text = r.get(self.field, _MISSING)
            if type(text) is str and len(text) <= MAX_TEXT:
                texts.append(text)
                continue
            error = self._problem(text, r)
            if not block.skip_bad:
                error.zephon_record = int(block.numbers[i])
                raise error
            bad[i] = str(error)
        if bad:
            block = block.without(bad)
        ids, offsets = tok.encode_flat(texts)
        lengths = np.diff(offsets)
        keep = lengths > 0
        counters = dict(block.counters)
        if not keep.all():
            counters["empty_documents"] = counters.get("empty_documents", 0) + int((~keep).sum())
            ids, lengths = ids[np.repeat(keep, lengths)], lengths[keep]
        tokens, offsets = _with_special(ids, lengths, tok.bos_id if self.add_bos else None,
                                        tok.eos_id if self.add_eos else None)  # fmt: skip
        return Docs(tokens, offsets, block.numbers[keep], block.dataset, counters, block.skipped)

    def _problem(self, text, record: dict) -> ValueError:
        """What is wrong with ``record[self.field]`` (``text``) as a document."""
        if text is _MISSING:
            return ValueError(
                f"tokenize(field={self.field!r}): the record has no such field; its fields are "
                f"{sorted(record)}"
            )
        if not isinstance(text, str):
            return ValueError(
                f"tokenize(field={self.field!r}): expected a string, got {type(text).__name__} "
                "(filter such records out first)"
            )
        return ValueError(
            f"tokenize(field={self.field!r}): a text of {len(text):,} characters, over the limit of "
            f"{MAX_TEXT:,} for one document (split it, or filter it out)"
        )


def _with_special(ids: np.ndarray, lengths: np.ndarray, bos: int | None, eos: int | None):
    """Documents of ``lengths`` tokens laid end to end in ``ids``, each given BOS and EOS:
    (tokens, offsets)."""
    extra = (bos is not None) + (eos is not None)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths + extra, out=offsets[1:])
    if not extra:
        return ids.astype(np.int32, copy=False), offsets
    tokens = np.empty(int(offsets[-1]), np.int32)
    shift = np.arange(len(lengths), dtype=np.int64) * extra + (bos is not None)
    tokens[np.arange(len(ids)) + np.repeat(shift, lengths)] = ids
    if bos is not None:
        tokens[offsets[:-1]] = bos
    if eos is not None:
        tokens[offsets[1:] - 1] = eos
    return tokens, offsets
