"""The closed catalog of Registry Stack product operations and results.

A workflow can call only what a catalog file in ``products/`` declares. The files
are data, one per product kind, each with its own version; an artifact carries
the descriptors of what its workflow uses, so a run keeps the exact operation
contract it was admitted under even after the catalog moves on.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from typing import cast

import jsonschema
import yaml

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.errors import CoordinatorError

_PARAM = re.compile(r"\{([a-zA-Z][A-Za-z0-9]*)\}")


class CatalogError(CoordinatorError, ValueError):
    """A catalog file or an artifact's descriptor that breaks the descriptor schema."""


class Effect(StrEnum):
    READ = "read"
    MUTATION = "mutation"


class Recovery(StrEnum):
    READ_AGAIN = "read-again"
    SAME_COMMAND = "same-command"
    SAME_COMMAND_AND_RECEIPT = "same-command-and-receipt"


@dataclass(frozen=True)
class Operation:
    product: str
    name: str
    method: str
    path: str
    effect: Effect
    idempotency_key: bool
    recovery: Recovery
    receipt: str | None
    request_schema: JSON
    response_schema: JSON
    descriptor: JSON

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(_PARAM.findall(self.path))

    @property
    def is_mutation(self) -> bool:
        return self.effect is Effect.MUTATION


@dataclass(frozen=True)
class Result:
    product: str
    name: str
    key: str
    fetch: Operation
    fetch_input: str
    final_field: str
    final_values: frozenset[str]
    descriptor: JSON

    def is_final(self, body: JSON) -> bool:
        return isinstance(body, dict) and body.get(self.final_field) in self.final_values


@dataclass(frozen=True)
class Product:
    kind: str
    version: str
    operations: dict[str, Operation]
    results: dict[str, Result]

    def descriptor(self, operations: set[str], results: set[str]) -> JSON:
        """This product's entry in an artifact: only the operations and results named,
        plus the read operations those results fetch with."""
        needed = set(operations) | {self.results[r].fetch.name for r in results}
        return {
            "product": self.kind,
            "version": self.version,
            "operations": {n: self.operations[n].descriptor for n in sorted(needed)},
            "results": {n: self.results[n].descriptor for n in sorted(results)},
        }


@dataclass(frozen=True)
class Catalog:
    products: dict[str, Product]

    @classmethod
    def from_descriptors(cls, data: JSON, *, trusted: bool = False) -> Catalog:
        """The catalog an artifact carries; ``trusted`` (read back for runs admitted under
        it) is built without judging it against this build's descriptor schema."""
        if not isinstance(data, dict):
            raise CatalogError("the catalog must be a mapping of product kinds")
        products = {}
        for kind, entry in data.items():
            product = _product(entry, trusted=trusted)
            if product.kind != kind:
                raise CatalogError(f"catalog entry {kind!r} describes product {product.kind!r}")
            products[kind] = product
        return cls(products)

    def operation(self, kind: str, name: str) -> Operation | None:
        product = self.products.get(kind)
        return product.operations.get(name) if product else None

    def result(self, kind: str, name: str) -> Result | None:
        product = self.products.get(kind)
        return product.results.get(name) if product else None


@functools.cache
def builtin_catalog() -> Catalog:
    """The catalog shipped in this package (``products/*.yaml``)."""
    products = {}
    folder = resources.files(__package__).joinpath("products")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml") and entry.name != "catalog.schema.yaml":
            product = _product(yaml.safe_load(entry.read_text("utf-8")))
            products[product.kind] = product
    return Catalog(products)


@functools.cache
def _descriptor_validator() -> jsonschema.Draft202012Validator:
    text = resources.files(__package__).joinpath("products", "catalog.schema.yaml")
    schema = yaml.safe_load(text.read_text("utf-8"))
    return jsonschema.Draft202012Validator(schema)


def _product(data: JSON, *, trusted: bool = False) -> Product:
    if trusted:
        try:
            return _build_product(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CatalogError(f"a product descriptor cannot be read: {exc!r}") from None
    problems = sorted(_descriptor_validator().iter_errors(data), key=lambda e: list(e.path))
    if problems:
        first = problems[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top)"
        raise CatalogError(f"product descriptor at {where}: {first.message}")
    for name, op in data["operations"].items():
        for schema in (op["request"], op["response"]):
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise CatalogError(
                    f"{data['product']}/{name}: invalid schema: {exc.message}"
                ) from None
    return _build_product(data)


def _build_product(data: JSON) -> Product:
    kind = cast(str, data["product"])
    operations = {}
    for name, op in data["operations"].items():
        params = _PARAM.findall(op["path"])
        required = set(op["request"].get("required", ()))
        if not set(params) <= required:
            raise CatalogError(f"{kind}/{name}: path parameters must be required inputs")
        operations[name] = Operation(
            product=kind,
            name=name,
            method=op["method"],
            path=op["path"],
            effect=Effect(op["effect"]),
            idempotency_key=op["idempotencyKey"],
            recovery=Recovery(op["recovery"]),
            receipt=op.get("receipt"),
            request_schema=op["request"],
            response_schema=op["response"],
            descriptor=op,
        )
    results = {}
    for name, res in data["results"].items():
        fetch = operations.get(res["fetch"])
        if fetch is None or fetch.effect is not Effect.READ:
            raise CatalogError(f"{kind}/{name}: fetch must name a read operation of {kind}")
        if res["fetchInput"] not in fetch.path_params:
            raise CatalogError(f"{kind}/{name}: fetchInput must be a path parameter of the fetch")
        results[name] = Result(
            product=kind,
            name=name,
            key=res["key"],
            fetch=fetch,
            fetch_input=res["fetchInput"],
            final_field=res["final"]["field"],
            final_values=frozenset(res["final"]["values"]),
            descriptor=res,
        )
    return Product(kind, data["version"], operations, results)
