"""Record functions at module level, so that the process runner can send them to workers."""

from __future__ import annotations


def shout(record: dict) -> dict:
    """Upper-case the text."""
    return {**record, "text": record["text"].upper()}


def long_enough(record: dict) -> bool:
    """Keep records of at least five words."""
    return record["text"].count(" ") >= 4


def keeps_most(record: dict) -> bool:
    """Drop the records whose text mentions a number ending in 5."""
    return "5 " not in record["text"]
