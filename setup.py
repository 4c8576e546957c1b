"""The one compiled part: the mixer's take by fixed shares (zephon/work/_shares.c), optional.

Built against Python's stable ABI (3.11 on), so one wheel serves every later Python. Where it
cannot be built (no C compiler), the install goes on without it and the mixer runs its Python,
which takes the same pieces (zephon.work.mixture says which it runs).
"""

import sys

from setuptools import Extension, setup

# no fused multiply-add: the keys are computed as Python computes them, one rounding a step
FLOAT_EXACT = [] if sys.platform == "win32" else ["-ffp-contract=off"]

setup(
    ext_modules=[
        Extension(
            "zephon.work._shares",
            ["zephon/work/_shares.c"],
            define_macros=[("Py_LIMITED_API", "0x030B0000")],
            py_limited_api=True,
            extra_compile_args=FLOAT_EXACT,
            optional=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
