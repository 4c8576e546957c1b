"""Worker processes import the main script again: refuse a pool made by its unguarded top level.

``forkserver`` and ``spawn`` workers import the script that started the program (as
``__mp_main__``, so that functions defined there can be unpickled by reference). A script that
makes its pipeline at its top level, outside ``if __name__ == "__main__":``, would run again in
every worker, which fails deep in multiprocessing, after the parent went on. Here the parent
finds it before any process starts: the running top-level statement of ``__main__`` that led to
the pool, read from the script's source.
"""

from __future__ import annotations

import ast
import sys
import tokenize


def check_main_is_guarded() -> None:
    """A ValueError, saying what to add, if the caller runs in the unguarded top level of a main
    script that worker processes would import again."""
    found = _unguarded_line()
    if found is not None:
        path, line = found
        raise ValueError(
            f"runner='process': {path}, line {line} starts worker processes from the top level of the "
            "script, and each worker imports the script again, so it would run that line again: "
            'put the script\'s code under `if __name__ == "__main__":` (or use runner="thread")'
        )


def _unguarded_line() -> tuple[str, int] | None:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if path is None or name.rpartition(".")[2] == "__main__":
        return None  # not imported again by the workers (python -c, a REPL, python -m pkg)
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is main.__dict__):
        frame = frame.f_back
    if frame is None:
        return None  # the script's top level has run: a function called later
    line = frame.f_lineno
    try:
        with tokenize.open(path) as f:
            statements = ast.parse(f.read()).body
    except (OSError, SyntaxError, ValueError):
        return None  # not a source file we can read: let multiprocessing say what it says
    for statement in statements:
        if _tests_name(statement):
            return None  # under `if __name__ ...` or after one (an early exit): trust it
        if statement.lineno <= line <= (statement.end_lineno or statement.lineno):
            return path, line
    return None


def _tests_name(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.If) and any(
        isinstance(node, ast.Name) and node.id == "__name__" for node in ast.walk(statement.test)
    )
