"""Every benchmark script imports against the current API (a rename in zephon fails here, not in
the next person's benchmark run): each is imported as a module, its ``main`` not run."""

from __future__ import annotations

import glob
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py")))


@pytest.mark.slow
@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_every_benchmark_imports_against_the_current_api(path):
    spec = importlib.util.spec_from_file_location(f"benchmark_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)) or os.path.basename(path) == "common.py"
