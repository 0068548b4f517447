"""The package's layers, held: no module imports from a layer above its own.

The layers, bottom up: the package root and ``errors``; ``authoring`` (offline: sources,
the checker, artifacts); ``semantics`` (pure step transitions); ``engine`` (runs in
PostgreSQL and the services that move them); ``http`` (the API and its client);
``devtools`` (stand-ins, the demo); and the composition roots ``cli``, ``service``,
``processes``, ``doctor``, ``addresses`` and ``__main__``. Below the engine nothing imports
an event loop, a database driver or an HTTP library, so checking and testing a workflow
offline needs none of them. Every import is read from the source, function-local ones
included, so a lazy import cannot hide an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.harness import ROOT

PACKAGE = ROOT / "src" / "registry_coordinator"
LAYERS = ["", "errors", "authoring", "semantics", "engine", "http", "devtools", "roots"]
ROOTS = {"cli", "service", "processes", "doctor", "addresses", "__main__"}
#: Libraries that need an event loop, a database or the network: the engine's and above.
RUNTIME_LIBRARIES = {"trio", "psycopg", "httpx", "quart", "quart_trio", "hypercorn"}


def _layer(module: str) -> int:
    """The layer of a module named relative to the package ("engine.store", "cli", "")."""
    head = module.split(".", maxsplit=1)[0]
    if head in ROOTS:
        return LAYERS.index("roots")
    assert head in LAYERS, f"{module} is in no layer: put it in one of the packages"
    return LAYERS.index(head)


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    """Every module ``module`` imports, absolute, with its line."""
    tree = ast.parse(path.read_text(), str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(
                    ["registry_coordinator", *base, *([node.module] if node.module else [])]
                )
            else:
                name = node.module or ""
            found.append((node.lineno, name))
            # ``from registry_coordinator.engine import store`` imports engine.store.
            found += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
    return found


def _edges() -> list[tuple[str, int, str]]:
    modules = _modules()
    edges = []
    for module, path in modules.items():
        for line, name in _imports(module, path):
            edges.append((module, line, name))
    return edges


def test_every_module_is_in_a_layer() -> None:
    for module in _modules():
        _layer(module)


@pytest.mark.parametrize("layer", LAYERS[1:])
def test_no_module_imports_from_a_layer_above_its_own(layer: str) -> None:
    modules = _modules()
    upward = []
    for module, line, name in _edges():
        if _layer(module) != LAYERS.index(layer) or not name.startswith("registry_coordinator"):
            continue
        target = name.removeprefix("registry_coordinator").lstrip(".")
        # ``from pkg import name`` names either a module or a member of pkg.
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if _layer(target) > _layer(module):
            upward.append(f"{module}:{line} imports {name}")
    assert not upward, "imports that point upward:\n" + "\n".join(upward)


def test_nothing_below_the_engine_needs_an_event_loop_a_database_or_the_network() -> None:
    engine = LAYERS.index("engine")
    found = [
        f"{module}:{line} imports {name}"
        for module, line, name in _edges()
        if _layer(module) < engine and name.split(".")[0] in RUNTIME_LIBRARIES
    ]
    assert not found, "\n".join(found)


def test_the_walk_sees_an_upward_edge(tmp_path: Path) -> None:
    """The tests above can fail: upward and runtime imports planted in an authoring
    module, one of them inside a function, are found."""
    planted = tmp_path / "checker.py"
    planted.write_text(
        "from registry_coordinator.engine import store\n"
        "def later():\n"
        "    import trio\n"
        "    from ..http.api import create_app\n"
    )
    edges = _imports("authoring.checker", planted)
    assert (1, "registry_coordinator.engine.store") in edges
    assert (3, "trio") in edges
    assert (4, "registry_coordinator.http.api") in edges
    assert _layer("engine.store") > _layer("authoring.checker")
