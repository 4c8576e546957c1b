"""Tokenize: records -> documents (one flat token array per chunk). Stateless."""

from __future__ import annotations

import itertools

import numpy as np

from zephon.io.tokenizer import TextTokenizer, load_tokenizer
from zephon.ops.base import WorkOperator
from zephon.ops.containers import Docs, RecordBlock


class Tokenize(WorkOperator):
    """Encodes ``record[field]`` in one batched call per chunk.

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
    ):
        super().__init__(parallelism)
        self.tokenizer_id, self.field = str(tokenizer_id), field
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
        return load_tokenizer(self.tokenizer_id)

    def params(self) -> dict:
        return {
            "tokenizer": self.tokenizer().fingerprint,
            "field": self.field,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
        }

    def work(self, block: RecordBlock) -> Docs:
        tok = self.tokenizer()
        ids = tok.encode_batch([self._text(r, block) for r in block.records])
        keep = np.fromiter((len(x) > 0 for x in ids), bool, len(ids))
        kept = [x for x in ids if x]
        head = [tok.bos_id] if self.add_bos else []
        tail = [tok.eos_id] if self.add_eos else []
        lengths = np.fromiter((len(x) for x in kept), np.int64, len(kept)) + len(head) + len(tail)
        flat = itertools.chain.from_iterable(itertools.chain(head, x, tail) for x in kept)
        tokens = np.fromiter(flat, np.int32, int(lengths.sum()))
        counters = dict(block.counters)
        if len(kept) < len(ids):
            counters["empty_documents"] = counters.get("empty_documents", 0) + len(ids) - len(kept)
        offsets = np.zeros(len(kept) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return Docs(tokens, offsets, block.numbers[keep], block.dataset, counters)

    def _text(self, record: dict, block: RecordBlock) -> str:
        try:
            text = record[self.field]
        except KeyError:
            raise ValueError(
                f"tokenize(field={self.field!r}): a record of dataset #{block.dataset} has no "
                f"such field; its fields are {sorted(record)}"
            ) from None
        if not isinstance(text, str):
            raise ValueError(
                f"tokenize(field={self.field!r}): expected a string, got {type(text).__name__} "
                f"in dataset #{block.dataset} (filter such records out first)"
            )
        return text
