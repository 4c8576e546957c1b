"""Text a crawl can hold that stresses a tokenizer, as strings and as a JSON lines file."""

from __future__ import annotations

import json


def hostile_texts() -> dict[str, str]:
    """Texts a crawl can hold that stress a tokenizer: huge runs, special tokens inside text,
    NUL bytes, both normal forms, bidirectional text and joiners, many scripts at once."""
    import unicodedata

    accents = "café naïve Ångström piñata 한국어"
    return {
        "a megabyte of one emoji": "😀" * (1 << 20),
        "a megabyte of spaces": " " * (1 << 20),
        "100k end-of-text tokens inside text": "x<|endoftext|>" * 100_000,
        "an unfinished special token": "<|endoftext|" * 1000 + "<|endoftext",
        "NUL bytes": "a\x00b\x00\x00c\x00",
        "NFC": unicodedata.normalize("NFC", accents),
        "NFD": unicodedata.normalize("NFD", accents),
        "right to left": "\u202eabc\u202c שלום עולם مرحبا بالعالم \u200f\u200e",
        "zero-width joiners": "👨\u200d👩\u200d👧\u200d👦 a\u200bb\u200cc\u200dd\ufeffe",
        "mixed scripts": "Hello Привет 你好 こんにちは मरहबा \U0001d518\U0001d52b \U0010ffff \ufffe 🇫🇷",
    }


def write_hostile_jsonl(path: str) -> str:
    """The hostile texts as JSON lines between "before" and "after", with two lone surrogates
    (bad records) and a surrogate pair (a good one); its path."""
    texts = ["before", *hostile_texts().values(), "a \ud800 lone high surrogate", "\udfff alone",
             "a pair \ud83d\ude00 is fine", "after"]  # fmt: skip
    with open(path, "w") as f:  # json.dumps writes a lone surrogate as a "\ud800" escape
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    return path
