"""The house rules that code can check: imports point down the layers, no cycles, small modules.

Every import counts, ``TYPE_CHECKING`` and function-level ones included (the AST is walked,
nothing is imported). Layers, bottom up (see docs/architecture.md):

L0 leaves ``_errors``, ``_launch_config``, ``_values``, ``_version``; L1 ``_runtime``; L2 ``_host``;
L3 ``_sched``; L4 the public facades (``tracing`` and ``metrics`` among them: public modules
over the scheduler's observation hooks); L5 ``_tools`` and ``testing`` (the pytest plugin),
which use the public API.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import aio_ascend

PACKAGE = Path(aio_ascend.__file__).parent
MAX_MODULE_LINES = 800

L0, L1, L2, L3, L4, L5 = range(6)
_FACADES = {
    "__init__",
    "_device",
    "_stream",
    "_event",
    "_graph",
    "_plan",
    "_closing_waits",
    "_module",
    "_buffer",
    "_hostfunc",
    "_interop",
    "_stream_sync",
    "sim",
    "tracing",
    "metrics",
}
#: L5: tools on top of the public API (they may import the package root)
_TOOLS = ("_tools", "__main__", "testing")


def layer_of(module: str) -> int:
    """The layer of ``aio_ascend.<...>`` module ``module``."""
    parts = module.split(".")
    assert parts[0] == "aio_ascend", module
    top = parts[1] if len(parts) > 1 else "__init__"
    if top in ("_errors", "_launch_config", "_unique", "_values", "_version"):
        return L0
    if top == "_runtime":
        return L1
    if top == "_host":
        return L2
    if top == "_sched":
        return L3
    if top in _FACADES:
        return L4
    if top in _TOOLS:
        return L5
    raise AssertionError(f"{module}: no layer is defined for it (add it to test_layers.py)")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every aio_ascend module ``path`` imports, wherever the import statement stands."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("aio_ascend"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("aio_ascend"):
                continue
            found.add(target)
            for alias in node.names:  # "from . import x" may name a submodule
                candidate = f"{target}.{alias.name}"
                if (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists() or (
                    PACKAGE.parent / candidate.replace(".", "/") / "__init__.py"
                ).exists():
                    found.add(candidate)
    found.discard(name)
    return found


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


def _package_init(module: str, imported: str) -> bool:
    # Importing a package runs its __init__: a parent package's __init__ is not a dependency
    # on the layer of that package's contents.
    return module.startswith(imported + ".")


def test_every_module_has_a_layer() -> None:
    for name in MODULES:
        layer_of(name)


def test_imports_point_down_the_layers() -> None:
    upward = []
    for name, imported in GRAPH.items():
        for target in imported:
            if target == "aio_ascend" and layer_of(name) == L5:
                continue  # the tools use the public API, re-exported by the package root
            if layer_of(target) > layer_of(name) and not _package_init(name, target):
                upward.append(f"{name} (L{layer_of(name)}) imports {target} (L{layer_of(target)})")
    assert not upward, "imports pointing up:\n" + "\n".join(sorted(upward))


def test_runtime_backends_do_not_import_each_other() -> None:
    backends = ("aio_ascend._runtime.sim", "aio_ascend._runtime.acl", "aio_ascend._runtime.cuda")
    crossing = []
    for name, imported in GRAPH.items():
        own = next((b for b in backends if name == b or name.startswith(b + ".")), None)
        if own is None:
            continue
        for target in imported:
            other = next((b for b in backends if target == b or target.startswith(b + ".")), None)
            if other is not None and other != own:
                crossing.append(f"{name} imports {target}")
    assert not crossing, crossing


def test_no_import_cycles() -> None:
    # Package __init__ edges that only re-export (the package root, aio_ascend.sim) are
    # what users import; the cycle check is about the modules doing the work.
    graph = {
        name: {t for t in imported if t in GRAPH and not _package_init(name, t)}
        for name, imported in GRAPH.items()
    }
    for root in ("aio_ascend",):
        graph[root] = set()
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_size(name: str) -> None:
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name} has {lines} lines (at most {MAX_MODULE_LINES})"


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    # The checks above can fail: an L3 module importing a facade is caught.
    fake = PACKAGE / "_sched" / "scheduler.py"
    assert "aio_ascend._stream" not in imports_of(fake)
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import aio_ascend._stream\n"
    )
    found = set()
    for node in ast.walk(ast.parse(probe.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    assert layer_of(next(iter(found))) == L4 > layer_of("aio_ascend._sched.scheduler")
