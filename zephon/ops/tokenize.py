"""Tokenize: records -> documents (one flat token array per chunk). Stateless."""

from __future__ import annotations

import re

import numpy as np

from zephon.io.tokenizer import TextTokenizer, load_tokenizer
from zephon.ops.base import WorkOperator
from zephon.ops.containers import Docs, Patches, RecordBlock

try:  # documents laid out with their special tokens and places, compiled (setup.py): the same values
    from zephon.ops._docs import lay_out as _lay_out
except ImportError:  # not built (no C compiler at install)
    _lay_out = None

# One document's text at most, in characters (8 Mi: longer than any book): a tokenizer needs
# about 160 bytes of memory per character of one text, and a single document this long is
# almost always a broken record.
MAX_TEXT = 8 << 20
_MISSING = object()
# A lone surrogate (half of a UTF-16 pair, as a JSON "\ud800" escape decodes to) is not Unicode:
# no backend can encode it, and each fails in its own words.
_SURROGATE = re.compile("[\ud800-\udfff]")


class Tokenize(WorkOperator):
    """Encodes ``record[field]`` in one batched call per chunk.

    ``backend``: ``"auto"`` encodes a ``tokenizer.json`` with fastokens where it is verified to
    give the same ids, ``"tokenizers"`` always with Hugging Face ``tokenizers``; the ids are the
    same, so it is a performance setting, not part of the recipe.

    Appends the tokenizer's EOS to every document (``add_eos``) and prepends its BOS where it
    defines one distinct from EOS (``add_bos``). A document with no tokens is skipped and counted.

    Image-text records (after ``images()``): ``image_field`` holds each record's images as
    patches; each patch becomes one ``image_token`` (an id, or a token of the vocabulary by
    name) after the BOS and before the text, and the patches travel with those tokens.
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
        image_field: str | None = None,
        image_token: int | str | None = None,
    ):
        super().__init__(parallelism)
        self.tokenizer_id, self.field, self.backend = str(tokenizer_id), field, backend
        tok = self.tokenizer()  # fail now, not in a worker, if it can't be loaded
        self.image_field, self.image_id = image_field, _image_id(tok, image_field, image_token)
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

    @property
    def tokenizers(self) -> tuple[tuple[str, str], ...]:
        # Hugging Face tokenizers alone load in a tenth of a second: each worker loads its own
        # (see zephon.runners.preload)
        return ((self.tokenizer_id, self.backend),) if self.backend == "auto" else ()

    def prepare(self) -> None:
        fast = getattr(self.tokenizer(), "fast", None)
        if fast is not None:  # loaded and probed: the first chunks get the fast backend
            fast.wait(fast.patience)  # (as long as a chunk would wait for it)

    def params(self) -> dict:
        return {
            "tokenizer": self.tokenizer().fingerprint,
            "field": self.field,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
            **({"image_field": self.image_field, "image_token": self.image_id} if self.image_field else {}),
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
        (ids, offsets), block = self._encode(tok, texts, block)
        images = self._images(block) if self.image_field else None
        lengths = np.diff(offsets)
        counts = None if images is None else np.fromiter(map(_patch_count, images), np.int64, len(images))
        keep = lengths > 0 if counts is None else lengths + counts > 0
        counters = dict(block.counters)
        if not keep.all():
            counters["empty_documents"] = counters.get("empty_documents", 0) + int((~keep).sum())
            ids, lengths = ids[np.repeat(keep, lengths)], lengths[keep]
            if images is not None:
                images, counts = [x for x, k in zip(images, keep, strict=True) if k], counts[keep]
        bos, eos = tok.bos_id if self.add_bos else None, tok.eos_id if self.add_eos else None
        if images is None or not counts.any():
            tokens, offsets, positions = _documents(ids, lengths, bos, eos)
            docs = Docs(tokens, offsets, block.numbers[keep], block.dataset, counters, block.skipped,
                        positions=positions)  # fmt: skip
            docs.token_positions()  # here, on the workers, not in the lane (where not laid out yet)
            return docs
        tokens, offsets, mask = _with_images(ids, lengths, counts, self.image_id, bos, eos)
        patch_at = np.zeros(len(tokens) + 1, np.int64)
        np.cumsum(mask, out=patch_at[1:])
        patches = Patches.concat([p for x in images for p in x], _patch_dim(images))
        return Docs(tokens, offsets, block.numbers[keep], block.dataset, counters, block.skipped,
                    patches, patch_at)  # fmt: skip

    def _encode(self, tok: TextTokenizer, texts: list[str], block: RecordBlock):
        """``tok.encode_flat(texts)`` and the block, less the records whose text is not valid
        Unicode where the dataset skips bad records (else the first such is the error). Texts
        are searched for lone surrogates only once the encoding failed: the common case pays
        nothing."""
        try:
            return tok.encode_flat(texts), block
        except (TypeError, UnicodeError):
            bad = {i: _surrogate_problem(self.field, t) for i, t in enumerate(texts) if _SURROGATE.search(t)}
            if not bad:
                raise
        if not block.skip_bad:
            first = min(bad)
            error = ValueError(bad[first])
            error.zephon_record = int(block.numbers[first])
            raise error from None
        texts = [t for i, t in enumerate(texts) if i not in bad]
        return tok.encode_flat(texts), block.without(bad)

    def _images(self, block: RecordBlock) -> list[list[Patches]]:
        """Each record's images, as patches (``images()`` made them)."""
        out = []
        for i, r in enumerate(block.records):
            value = r.get(self.image_field, _MISSING)
            if value is None:
                value = []
            if not (isinstance(value, list) and all(isinstance(x, Patches) for x in value)):
                what = "no such field" if value is _MISSING else f"{type(value).__name__}, not patches"
                error = ValueError(
                    f"tokenize(image_field={self.image_field!r}): the record holds {what}; put "
                    f"images(field={self.image_field!r}) before tokenize"
                )
                error.zephon_record = int(block.numbers[i])
                raise error
            out.append(value)
        return out

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


def _surrogate_problem(field: str, text: str) -> str:
    at = _SURROGATE.search(text).start()
    return (
        f"tokenize(field={field!r}): the text holds a lone surrogate U+{ord(text[at]):04X} at character "
        f"{at:,}, which is not valid Unicode (a JSON \\u{ord(text[at]):04x} escape without its pair?): "
        "fix the data, or skip bad records with on_error='skip'"
    )


def _image_id(tok: TextTokenizer, image_field: str | None, image_token) -> int | None:
    if image_field is None:
        if image_token is not None:
            raise ValueError("tokenize(image_token=...) needs image_field=, the field images() wrote")
        return None
    if isinstance(image_token, str):
        lookup = getattr(getattr(tok, "backend", None), "token_to_id", None)
        token_id = lookup(image_token) if lookup else None
        if token_id is None:
            raise ValueError(
                f"tokenize(image_token={image_token!r}): not a token of {tok.tokenizer_id!r}; pass "
                "a token id (one the model reserves for image tokens)"
            )
        return int(token_id)
    if not isinstance(image_token, int) or isinstance(image_token, bool) or image_token < 0:
        raise ValueError(
            f"tokenize(image_field={image_field!r}) needs image_token: the id (or name) of the "
            f"placeholder token for image patches, got {image_token!r}"
        )
    return image_token


def _patch_count(images: list[Patches]) -> int:
    return sum(len(p) for p in images)


def _patch_dim(images: list[list[Patches]]) -> int:
    return next((p.pixels.shape[1] for x in images for p in x), 0)


def _with_images(ids, lengths, counts, image_id: int, bos: int | None, eos: int | None):
    """As ``_with_special``, with ``counts[d]`` image tokens after document d's BOS:
    (tokens, offsets, image token mask)."""
    bos_n = int(bos is not None)
    doc_lengths = lengths + counts + bos_n + (eos is not None)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(doc_lengths, out=offsets[1:])
    tokens = np.empty(int(offsets[-1]), np.int32)
    mask = np.zeros(len(tokens), bool)
    image_at = _ranges(offsets[:-1] + bos_n, counts)
    tokens[image_at], mask[image_at] = image_id, True
    tokens[_ranges(offsets[:-1] + bos_n + counts, lengths)] = ids
    if bos is not None:
        tokens[offsets[:-1]] = bos
    if eos is not None:
        tokens[offsets[1:] - 1] = eos
    return tokens, offsets, mask


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``start, start + 1, ..., start + count - 1`` for each pair, laid end to end."""
    total = int(counts.sum())
    before = np.zeros(len(counts), np.int64)
    np.cumsum(counts[:-1], out=before[1:])
    return np.repeat(starts - before, counts) + np.arange(total)


def _documents(ids: np.ndarray, lengths: np.ndarray, bos: int | None, eos: int | None):
    """``_with_special``'s (tokens, offsets) and each token's place in its document, in one pass
    where the compiled lay-out (``_docs.c``) was built; else the places are None (made by
    ``Docs.token_positions``)."""
    if _lay_out is None:
        return (*_with_special(ids, lengths, bos, eos), None)
    extra = (bos is not None) + (eos is not None)
    tokens = np.empty(len(ids) + len(lengths) * extra, np.int32)
    offsets, positions = np.empty(len(lengths) + 1, np.int64), np.empty(len(tokens), np.int32)
    ids, lengths = np.ascontiguousarray(ids, np.int32), np.ascontiguousarray(lengths, np.int64)
    _lay_out(ids, lengths, -1 if bos is None else bos, -1 if eos is None else eos, tokens, offsets, positions)
    return tokens, offsets, positions


def _with_special(ids: np.ndarray, lengths: np.ndarray, bos: int | None, eos: int | None):
    """Documents of ``lengths`` tokens laid end to end in ``ids``, each given BOS and EOS:
    (tokens, offsets)."""
    extra = (bos is not None) + (eos is not None)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths + extra, out=offsets[1:])
    if not extra:
        return ids.astype(np.int32, copy=False), offsets
    tokens = np.empty(int(offsets[-1]), np.int32)
    text = np.ones(len(tokens), bool)  # where the ids go: all but the special tokens' places
    if bos is not None:
        text[offsets[:-1]] = False
    if eos is not None:
        text[offsets[1:] - 1] = False
    tokens[text] = ids
    if bos is not None:
        tokens[offsets[:-1]] = bos
    if eos is not None:
        tokens[offsets[1:] - 1] = eos
    return tokens, offsets
