"""Errors that say where they happened, without losing what happened."""

from __future__ import annotations


def with_context(error: BaseException, where: str) -> BaseException:
    """``error`` with ``where`` in front of its message: a new error of the same type chained to
    it where the type can be built from a message alone, else the same error with a note."""
    try:
        new = type(error)(f"{where}: {error}")
    except Exception:
        new = None
    if new is None or str(new) != f"{where}: {error}":
        error.add_note(where)
        return error
    new.__cause__ = error
    return new
