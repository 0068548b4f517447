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


def finals(result: Result, code: str = "") -> str:
    """When a result's answer is final, in words: each condition's fields and values."""
    conditions = []
    for condition in result.finals:
        parts = [
            f"{code}{name}{code} is " + ", ".join(f"{code}{v}{code}" for v in sorted(values))
            for name, values in sorted(condition.items())
        ]
        conditions.append(" and ".join(parts))
    return "; or ".join(conditions)


def delivery(result: Result) -> str:
    """How the product makes a result known, in words."""
    ways = []
    if result.push is not None:
        ways.append(f"pushes {result.push.event}")
    if result.feed is not None:
        ways.append(f"lists it on the feed GET {result.feed.path}")
    if ways:
        return " and ".join(ways) + ", which wake the run to read it"
    if result.read_only:
        return "sends nothing: it is read on a backoff schedule"
    return "Coordinator's signed result webhooks wake the run to read it"


def _result_line(result: Result) -> str:
    return (
        f"{result.name}: keyed by {result.key}, read with {result.fetch.name}, final when "
        f"{finals(result)}; the product {delivery(result)} — {_description(result.descriptor)}"
    )


def _product_lines(product: Product) -> list[str]:
    lines = [f"{product.kind} {product.version}"]
    if product.parameters:
        lines.append("  connection-bound parameters (set per connection, never workflow input):")
        lines += [
            f"    {p.name}: sent as {p.where} {p.wire} — {p.description}"
            for _, p in sorted(product.parameters.items())
        ]
    lines.append("  operations:")
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
    if op.bound:
        names = ", ".join(f"{p.name} ({p.where} {p.wire})" for p in op.bound)
        lines.append(f"  sends the connection's {names}")
    if op.receipt:
        sends = "" if op.receipt.method == "GET" else " with the original key and body"
        lines.append(f"  receipt lookup: {op.receipt.method} {op.receipt.path}{sends}")
    if op.prepare:
        lines.append(f"  prepared before it is sealed: {op.prepare}")
    if op.external:
        lines.append(
            "  the connection's review decides what may be read and what answers fit: "
            "paths, queryParameters, responseSchema (docs/operations.md)"
        )
    lines += ["  input (the step's with:):", *(f"    {x}" for x in _schema(op.request_schema))]
    lines += ["  result (steps.ID):", *(f"    {x}" for x in _schema(op.response_schema))]
    return "\n".join(lines) + "\n"


def markdown(catalog: Catalog) -> str:
    """The catalog reference of docs/workflows.md: a table per product."""
    parts = []
    for kind, product in sorted(catalog.products.items()):
        parts.append(f"### `{kind}` {product.version}\n")
        contract = product.contract if isinstance(product.contract, dict) else {}
        follows = contract.get("follows") or []
        if follows:
            files = ", ".join(f"`{f['path']}` at `{f['commit'][:8]}`" for f in follows)
            parts.append(f"Follows `{contract['repository']}`: {files}.\n")
        if product.parameters:
            parts.append("| connection parameter | sent as | what it is |")
            parts.append("|---|---|---|")
            for name, parameter in sorted(product.parameters.items()):
                parts.append(
                    f"| `{name}` | {parameter.where} `{parameter.wire}` | {parameter.description} |"
                )
            parts.append("")
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
            parts.append("| result (wait-for) | key | read with | final when | made known |")
            parts.append("|---|---|---|---|---|")
            for name, result in sorted(product.results.items()):
                parts.append(
                    f"| `{name}` | `{result.key}` | `{result.fetch.name}` "
                    f"| {finals(result, '`')} | the product {delivery(result)} |"
                )
        parts.append("")
    return "\n".join(parts)
