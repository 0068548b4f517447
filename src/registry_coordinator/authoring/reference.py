"""The catalog read by people: ``coordinator catalog`` and the catalog reference in
docs/workflows.md, both written from the catalog's own data, so neither can drift from
what the checker accepts (a test keeps the page equal to :func:`markdown`).
"""

from __future__ import annotations

import difflib
import json

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.catalog import Catalog, Operation, Product, Result


class Unknown(LookupError):
    """A product or operation the catalog does not have; the message says which it has."""


def _pick(name: str, known: list[str], what: str) -> None:
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]}?" if close else f"the catalog has: {', '.join(known)}"
        raise Unknown(f"no {what} {name!r} in the catalog: {hint}")


def _description(descriptor: JSON) -> str:
    text = descriptor.get("description") if isinstance(descriptor, dict) else None
    return str(text) if text else ""


def _operation_line(op: Operation) -> str:
    key = ", Idempotency-Key" if op.idempotency_key else ""
    return f"{op.name}: {op.effect} {op.method} {op.path}{key} — {_description(op.descriptor)}"


def _result_line(result: Result) -> str:
    finals = ", ".join(sorted(result.final_values))
    return (
        f"{result.name}: keyed by {result.key}, read with {result.fetch.name}, final when "
        f"{result.final_field} is {finals} — {_description(result.descriptor)}"
    )


def _product_lines(product: Product) -> list[str]:
    lines = [f"{product.kind} {product.version}", "  operations:"]
    lines += [f"    {_operation_line(op)}" for _, op in sorted(product.operations.items())]
    if product.results:
        lines.append("  results (for wait-for):")
        lines += [f"    {_result_line(r)}" for _, r in sorted(product.results.items())]
    return lines


def _schema(schema: JSON) -> list[str]:
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False).splitlines()


def text(catalog: Catalog, product: str | None = None, operation: str | None = None) -> str:
    """Every product with its operations and results; one product's; or one operation's
    whole description with its input and result schemas. :class:`Unknown` for a name the
    catalog does not have."""
    if product is None:
        lines = []
        for _, found in sorted(catalog.products.items()):
            lines += [*_product_lines(found), ""]
        return "\n".join(lines)
    _pick(product, sorted(catalog.products), "product")
    found = catalog.products[product]
    if operation is None:
        return "\n".join(_product_lines(found)) + "\n"
    _pick(operation, sorted(found.operations), f"operation of {product}")
    op = found.operations[operation]
    lines = [
        f"{product}/{op.name}: {_description(op.descriptor)}",
        f"  {op.method} {op.path}",
        f"  effect: {op.effect}; recovery after an unknown outcome: {op.recovery}",
        f"  Idempotency-Key: {'sent' if op.idempotency_key else 'not sent'}",
    ]
    if op.receipt:
        lines.append(f"  receipt lookup: GET {op.receipt}")
    lines += ["  input (the step's with:):", *(f"    {x}" for x in _schema(op.request_schema))]
    lines += ["  result (steps.ID):", *(f"    {x}" for x in _schema(op.response_schema))]
    return "\n".join(lines) + "\n"


def markdown(catalog: Catalog) -> str:
    """The catalog reference of docs/workflows.md: a table per product."""
    parts = []
    for kind, product in sorted(catalog.products.items()):
        parts.append(f"### `{kind}` {product.version}\n")
        parts.append("| operation | effect | request | what it does |")
        parts.append("|---|---|---|---|")
        for name, op in sorted(product.operations.items()):
            required = op.request_schema.get("required", []) if op.request_schema else []
            inputs = ", ".join(f"`{r}`" for r in required) or "—"
            parts.append(
                f"| `{name}` | {op.effect} | `{op.method} {op.path}` (needs {inputs}) "
                f"| {_description(op.descriptor)} |"
            )
        if product.results:
            parts.append("")
            parts.append("| result (wait-for) | key | read with | final when |")
            parts.append("|---|---|---|---|")
            for name, result in sorted(product.results.items()):
                finals = ", ".join(f"`{v}`" for v in sorted(result.final_values))
                parts.append(
                    f"| `{name}` | `{result.key}` | `{result.fetch.name}` "
                    f"| `{result.final_field}` is {finals} |"
                )
        parts.append("")
    return "\n".join(parts)
