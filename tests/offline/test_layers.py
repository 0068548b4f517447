"""The package's layers, held: no module imports from a layer above its own.

The layers, bottom up: the package root and ``errors``; ``authoring`` (offline: sources,
the checker, artifacts); ``semantics`` (pure step transitions); ``custody`` (personal
data sealed where it belongs, pure); ``config`` (the service's configuration file, read
without connecting); ``store`` (runs in PostgreSQL: the database
layer, named queries, migrations); ``observability`` (metrics, logs, traces, health);
``engine`` (the services that move runs); ``audit`` (checkpoints, verification, export,
retention); ``http`` (the API, the console and the API's client); ``devtools`` (stand-ins,
the demo); and the composition roots ``cli``, ``service``, ``processes``, ``doctor``,
``addresses`` and ``__main__``. Up to ``semantics`` nothing imports an event loop, a
database driver or an HTTP library, so checking and testing a workflow offline needs none
of them. Every import is read from the source, function-local ones included, so a lazy
import cannot hide an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from registry_coordinator import store
from registry_coordinator.store import runs
from tests.support import ROOT

PACKAGE = ROOT / "src" / "registry_coordinator"
LAYERS = [
    "",
    "errors",
    "authoring",
    "semantics",
    "custody",
    "config",
    "store",
    "observability",
    "engine",
    "audit",
    "http",
    "devtools",
    "roots",
]
ROOTS = {"cli", "service", "processes", "doctor", "addresses", "__main__"}
#: Libraries that need an event loop, a database or the network: from ``config`` up.
RUNTIME_LIBRARIES = {"trio", "psycopg", "httpx", "quart", "quart_trio", "hypercorn"}


def _layer(module: str) -> int:
    """The layer of a module named relative to the package ("store.runs", "cli", "")."""
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
            # ``from registry_coordinator.store import runs`` imports store.runs.
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


def test_nothing_offline_needs_an_event_loop_a_database_or_the_network() -> None:
    offline = LAYERS.index("semantics")
    found = [
        f"{module}:{line} imports {name}"
        for module, line, name in _edges()
        if _layer(module) <= offline and name.split(".")[0] in RUNTIME_LIBRARIES
    ]
    assert not found, "\n".join(found)


def test_the_walk_sees_an_upward_edge(tmp_path: Path) -> None:
    """The tests above can fail: upward and runtime imports planted in an authoring
    module, one of them inside a function, are found."""
    planted = tmp_path / "checker.py"
    planted.write_text(
        "from registry_coordinator.store import runs\n"
        "def later():\n"
        "    import trio\n"
        "    from ..http.api import create_app\n"
    )
    edges = _imports("authoring.checker", planted)
    assert (1, "registry_coordinator.store") in edges
    assert (3, "trio") in edges
    assert (4, "registry_coordinator.http.api") in edges
    assert _layer("store.runs") > _layer("authoring.checker")


#: A package this large is a drawer, not a room: past it, its docstring says why.
ROOM_SIZE = 15


def test_every_package_is_a_room_or_says_why_it_is_larger() -> None:
    crowded = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        modules = [p for p in init.parent.glob("*.py") if p.name != "__init__.py"]
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        if len(modules) > ROOM_SIZE and "larger than a room" not in docstring:
            crowded.append(f"{init.parent.relative_to(PACKAGE)}: {len(modules)} modules")
    assert not crowded, (
        "split these, or say in the package docstring why it is larger than a room:\n"
        + "\n".join(crowded)
    )


def test_the_store_face_is_every_public_name_of_runs() -> None:
    """``store.X`` is how the engine and the HTTP layer reach the runs, so every public name
    ``store.runs`` defines is in its ``__all__`` (a name left out is reachable only by a path
    that bypasses the face), and the package gives each of them."""
    defined = set()
    for node in ast.parse(Path(runs.__file__).read_text()).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            defined.add(node.targets[0].id)
    missing = sorted(n for n in defined - set(runs.__all__) if not n.startswith("_"))
    assert not missing, f"not in store.runs.__all__: {missing}"
    assert all(getattr(store, name) is getattr(runs, name) for name in runs.__all__)


def _test_imports(path: Path, package: list[str]) -> list[tuple[int, str]]:
    """The test modules (``test_*``) the module at ``path`` in ``package`` imports, with their
    line: by name, relatively, or as a member of their package, function-local ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names = [module] if "test_" in module else [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        found += [
            (node.lineno, name)
            for name in names
            if any(part.startswith("test_") for part in name.split("."))
        ]
    return sorted(found)


def test_no_test_module_imports_another() -> None:
    """What two test modules share lives in tests/support, not in one of them: a test module
    another imports is a helper library that pytest also collects, and the two change
    together for reasons that are neither's."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        package = list(path.relative_to(ROOT).parent.parts)
        found += [
            f"{path.relative_to(ROOT)}:{line} imports {name}"
            for line, name in _test_imports(path, package)
        ]
    assert not found, "move what they share into tests/support:\n" + "\n".join(found)


def test_the_walk_sees_a_test_module_imported(tmp_path: Path) -> None:
    """The test above can fail: each way of importing a test module, planted in a module of
    tests/service (one of them inside a function), is found; support modules are not."""
    planted = tmp_path / "test_planted.py"
    planted.write_text(
        "from tests.service.test_results import push\n"
        "from .test_surface import metrics\n"
        "from . import test_tracing\n"
        "def later():\n"
        "    import tests.chaos.test_chaos\n"
        "from tests.support import Services\n"
        "from tests.support.interleave import Failing\n"
        "from .. import conftest\n"
    )
    assert _test_imports(planted, ["tests", "service"]) == [
        (1, "tests.service.test_results"),
        (2, "tests.service.test_surface"),
        (3, "tests.service.test_tracing"),
        (5, "tests.chaos.test_chaos"),
    ]
