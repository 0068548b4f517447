"""The HTTP layer runs no statement: it reads and writes runs only through engine functions.

Every statement a request can cause is then found in the engine (``store``, ``health``,
``operator_actions``), beside the others that touch the same rows, and a handler never
needs changing for a change of schema. Checked on the source, as ``test_layers`` checks
imports: a call of a :class:`~registry_coordinator.store.database.Database` or
``Connection`` method that runs SQL or holds a connection, by its name whatever the
receiver (nothing else the layer uses has methods of these names), and any string in the
layer that names a query of ``sql/queries.sql``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from registry_coordinator.store.database import QUERIES
from tests.support import ROOT

HTTP = ROOT / "src" / "registry_coordinator" / "http"
#: The methods of Database and Connection that run a statement or hold a connection.
DATABASE_METHODS = {"row", "rows", "execute", "transaction", "connection"}


def _findings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in DATABASE_METHODS
        ):
            found.append((node.lineno, node.col_offset, f"calls .{node.func.attr}()"))
        elif isinstance(node, ast.Constant) and node.value in QUERIES:
            found.append((node.lineno, node.col_offset, f"names the query {node.value!r}"))
    return [f"{path.name}:{line}: {what}" for line, _, what in sorted(found)]


def test_no_module_of_the_http_layer_runs_a_statement() -> None:
    modules = sorted(HTTP.glob("*.py"))
    assert len(modules) > 5
    findings = [finding for path in modules for finding in _findings(path)]
    assert findings == [], "go through an engine function instead:\n" + "\n".join(findings)


def test_the_check_sees_a_statement_and_a_query_name(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "async def f(context):\n"
        "    async with context.db.connection() as conn:\n"
        "        await conn.row('server_version')\n"
    )
    assert _findings(sample) == [
        "sample.py:2: calls .connection()",
        "sample.py:3: calls .row()",
        "sample.py:3: names the query 'server_version'",
    ]
