"""The layers of DESIGN.md hold in the code: no import cycle in the engine, TorchTitan and
torch.distributed only in the adapter, no test fakes in the installed package."""

from __future__ import annotations

import ast
import os
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "zephon")


def _modules() -> dict[str, str]:
    """Module name -> file, for every module of the package."""
    out = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                out[module] = path
    return out


def _imports(path: str, modules: dict[str, str]) -> set[str]:
    """The package's modules that ``path`` imports, anywhere in it (``from pkg import sub``
    names the submodule ``sub``, not the package)."""
    found = set()
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m in modules}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_of_the_engine_imports_one_that_imports_it_back():
    modules = _modules()
    graph = defaultdict(set, {m: _imports(p, modules) - {m} for m, p in modules.items()})
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


def test_only_the_adapter_imports_torchtitan_or_torch_distributed():
    offenders = []
    for module, path in _modules().items():
        if module.startswith("zephon.torchtitan"):
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        if any(n.startswith(("torchtitan", "torch.distributed", "zephon.torchtitan")) for n in names):
            offenders.append(module)
    assert offenders == []


def test_the_installed_package_holds_no_test_fake():
    fakes = [m for m in _modules() if m.rsplit(".", 1)[-1].startswith("fake") or ".testing.functions" in m]
    assert fakes == []
