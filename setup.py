"""The compiled parts, all optional: the mixer's take by fixed shares (zephon/work/_shares.c),
laying pieces out end to end in rows (zephon/ops/_rows.c), a chunk's documents with their
special tokens (zephon/ops/_docs.c) and the JSON lines reader's check of a chunk's lines
(zephon/io/formats/_lines.c).

Built against Python's stable ABI (3.11 on), so one wheel serves every later Python. Where it
cannot be built (no C compiler), the install goes on without them and the lane runs their Python,
which gives the same values (tests/test_*_native.py compare them).
"""

import sys

from setuptools import Extension, setup

# no fused multiply-add: the keys are computed as Python computes them, one rounding a step
FLOAT_EXACT = [] if sys.platform == "win32" else ["-ffp-contract=off"]


def compiled(name: str) -> Extension:
    return Extension(
        name,
        [name.replace(".", "/") + ".c"],
        define_macros=[("Py_LIMITED_API", "0x030B0000")],
        py_limited_api=True,
        extra_compile_args=FLOAT_EXACT,
        optional=True,
    )


setup(
    ext_modules=[
        compiled(name)
        for name in (
            "zephon.work._shares",
            "zephon.ops._rows",
            "zephon.ops._docs",
            "zephon.io.formats._lines",
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
