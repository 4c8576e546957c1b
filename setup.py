"""The compiled parts, both optional: the mixer's take by fixed shares (zephon/work/_shares.c)
and laying pieces out end to end in rows (zephon/ops/_rows.c).

Built against Python's stable ABI (3.11 on), so one wheel serves every later Python. Where it
cannot be built (no C compiler), the install goes on without them and the lane runs their Python,
which gives the same values (tests/test_mixer_native.py and test_packing_native.py compare them).
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
    ext_modules=[compiled("zephon.work._shares"), compiled("zephon.ops._rows")],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
