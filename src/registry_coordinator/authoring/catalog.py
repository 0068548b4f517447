"""The closed catalog of Registry Stack product operations and results.

A workflow can call only what a catalog file in ``products/`` declares. The files
are data, one per product kind, each with its own version, and each descriptor names
the upstream file and commit of the product's published contract it follows (a
contract test holds it there). An artifact carries the descriptors of what its
workflow uses, so a run keeps the exact operation contract it was admitted under even
after the catalog moves on: descriptors written by older catalogs are still read
(:func:`_receipt`, :func:`_finals` say how their older forms are taken).

Besides its route and schemas, a descriptor says how the product's answers are read —
which statuses are a success, a refusal, a key spent on an original whose answer is
gone (:class:`Operation`); which answers of a result's read mean not yet, never, or
final, and how the product makes a result known (:class:`Result`) — and which of its
parameters belong to the deployment rather than the workflow (:class:`Parameter`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from typing import cast

import jsonschema
import yaml

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.errors import CoordinatorError

_PARAM = re.compile(r"\{([a-zA-Z][A-Za-z0-9]*)\}")

#: The statuses that say a product refused a command as sent, where a descriptor does not
#: list its own (SPEC section 5): the run fails.
DEFAULT_REFUSALS = frozenset({400, 404, 409, 422})


class CatalogError(CoordinatorError, ValueError):
    """A catalog file or an artifact's descriptor that breaks the descriptor schema."""


class Effect(StrEnum):
    READ = "read"
    MUTATION = "mutation"


class Recovery(StrEnum):
    """What may be done about a call whose outcome is unknown."""

    #: A read: it is simply sent again.
    READ_AGAIN = "read-again"
    #: A mutation only an operator may resend, byte for byte with its original key.
    SAME_COMMAND = "same-command"
    #: The same, and the product keeps a receipt of the original key, which Coordinator
    #: may ask for (it never causes an effect).
    SAME_COMMAND_AND_RECEIPT = "same-command-and-receipt"
    #: A mutation whose product answers the identical request under the same key with the
    #: original answer, as its documented recovery: resending it cannot act twice.
    IDENTICAL_REQUEST = "identical-request"


class Where(StrEnum):
    """Where a connection-bound parameter goes in a request."""

    HEADER = "header"
    QUERY = "query"
    BODY = "body"


class Gone(StrEnum):
    """What a result read says when the result will not be readable."""

    #: Unknown, or not visible to Coordinator's identity: an operator looks into it.
    CONCEALED = "result-concealed"
    #: No longer retained by the product: the wait cannot end with it.
    EXPIRED = "result-expired"


@dataclass(frozen=True)
class Parameter:
    """A value the operator sets per connection, placed in every request of the
    operations that name it — never workflow input — and sealed with the request."""

    name: str  # as the connection's configuration names it
    where: Where
    wire: str  # the header, query parameter or body member it is sent as
    schema: JSON
    description: str

    def problem(self, value: JSON) -> str | None:
        """Why ``value`` is not one this parameter takes, if it is not."""
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(self.schema).iter_errors(value)
        )
        return error.message if error is not None else None


@dataclass(frozen=True)
class Receipt:
    """The product's read-only lookup of its record of an original idempotency key."""

    method: str  # GET: the path names the key; POST: the original key and body are resent
    path: str
    #: Answers that say no retained receipt matches: not evidence that the original had
    #: no effect (the run stays held).
    unresolved: frozenset[int]


@dataclass(frozen=True)
class Operation:
    product: str
    name: str
    method: str
    path: str
    effect: Effect
    idempotency_key: bool
    recovery: Recovery
    receipt: Receipt | None
    request_schema: JSON
    response_schema: JSON
    descriptor: JSON
    bound: tuple[Parameter, ...] = ()
    success: frozenset[int] | None = None  # None: any 2xx
    refusals: frozenset[int] = DEFAULT_REFUSALS
    refused_codes: frozenset[str] = frozenset()
    spent_codes: frozenset[str] = frozenset()
    prepare: str | None = None
    #: Whether the operation runs under Casework's task authority where the connection has
    #: one ("optional"), only so ("required"), or never (None).
    grant: str | None = None
    #: A read of an operator-configured external connection (:mod:`semantics.external`):
    #: every answer but a redirect is its result.
    external: bool = False

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(_PARAM.findall(self.path))

    @property
    def is_mutation(self) -> bool:
        return self.effect is Effect.MUTATION

    def succeeded(self, status: int) -> bool:
        """Whether ``status`` is one this operation's success is answered with."""
        if self.external:
            return not 300 <= status < 400
        return status in self.success if self.success is not None else 200 <= status < 300


@dataclass(frozen=True)
class Push:
    """A result the product pushes as an event, which only wakes the run to read it."""

    event: str  # the event's type
    key: str  # its member holding the result's key
    event_id: str  # its member identifying it


@dataclass(frozen=True)
class Feed:
    """A feed of completions the product offers, read with one cursor per connection."""

    path: str
    cursor: str  # the query parameter taking the cursor
    limit: int
    items: str
    next: str
    key: str
    event_id: str


@dataclass(frozen=True)
class Result:
    product: str
    name: str
    key: str
    fetch: Operation
    fetch_input: str
    #: Any of these conditions makes an answer final: each maps top-level fields to the
    #: values each may have.
    finals: tuple[Mapping[str, frozenset[str]], ...]
    descriptor: JSON
    pending: frozenset[int] = frozenset()  # read statuses that say: not yet
    gone: Mapping[int, Gone] | None = None  # read statuses that say: never
    push: Push | None = None
    feed: Feed | None = None
    #: The product makes the result known only when it is read: it is read on a backoff
    #: schedule rather than at a slow fallback poll. (An older descriptor says nothing of
    #: delivery: its results were woken by Coordinator's signed webhooks.)
    read_only: bool = False

    def is_final(self, body: JSON) -> bool:
        if not isinstance(body, dict):
            return False
        return any(
            all(body.get(name) in values for name, values in condition.items())
            for condition in self.finals
        )

    def vanished(self, status: int) -> Gone | None:
        return (self.gone or {}).get(status)


@dataclass(frozen=True)
class Product:
    kind: str
    version: str
    operations: dict[str, Operation]
    results: dict[str, Result]
    parameters: dict[str, Parameter]
    problems: dict[str, int]
    contract: JSON = None

    def descriptor(self, operations: set[str], results: set[str]) -> JSON:
        """This product's entry in an artifact: only the operations and results named,
        plus the read operations those results fetch with, the parameters they send, the
        product's problem vocabulary and the contract they follow."""
        needed = set(operations) | {self.results[r].fetch.name for r in results}
        bound = {p.name for n in needed for p in self.operations[n].bound}
        entry: dict[str, JSON] = {
            "product": self.kind,
            "version": self.version,
            "operations": {n: self.operations[n].descriptor for n in sorted(needed)},
            "results": {n: self.results[n].descriptor for n in sorted(results)},
        }
        if self.contract is not None:
            entry["contract"] = self.contract
        if bound:
            entry["parameters"] = {
                n: _parameter_descriptor(self.parameters[n]) for n in sorted(bound)
            }
        if self.problems:
            entry["problems"] = dict(sorted(self.problems.items()))
        return entry


def _parameter_descriptor(parameter: Parameter) -> JSON:
    return {
        "in": parameter.where.value,
        "name": parameter.wire,
        "description": parameter.description,
        "schema": parameter.schema,
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
    schemas = [
        (f"operation {n}", s)
        for n, op in data["operations"].items()
        for s in (op["request"], op["response"])
    ]
    schemas += [(f"parameter {n}", p["schema"]) for n, p in data.get("parameters", {}).items()]
    for name, schema in schemas:
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise CatalogError(f"{data['product']}/{name}: invalid schema: {exc.message}") from None
    return _build_product(data)


def _build_product(data: JSON) -> Product:
    kind = cast(str, data["product"])
    problems = {str(code): int(status) for code, status in data.get("problems", {}).items()}
    parameters = {
        name: Parameter(name, Where(p["in"]), p["name"], p["schema"], p.get("description", ""))
        for name, p in data.get("parameters", {}).items()
    }
    operations = {
        name: _operation(kind, name, op, parameters, problems)
        for name, op in data["operations"].items()
    }
    results = {name: _result(kind, name, res, operations) for name, res in data["results"].items()}
    return Product(
        kind, data["version"], operations, results, parameters, problems, data.get("contract")
    )


def _operation(
    kind: str, name: str, op: JSON, parameters: dict[str, Parameter], problems: dict[str, int]
) -> Operation:
    params = _PARAM.findall(op["path"])
    required = set(op["request"].get("required", ()))
    if not set(params) <= required:
        raise CatalogError(f"{kind}/{name}: path parameters must be required inputs")
    bound = []
    for parameter in op.get("bound", ()):
        if parameter not in parameters:
            raise CatalogError(
                f"{kind}/{name}: sends parameter {parameter!r}, which is not declared"
            )
        bound.append(parameters[parameter])
    codes = {c for field in ("refusedCodes", "spentCodes") for c in op.get(field, ())}
    if problems and not codes <= set(problems):
        unknown = ", ".join(sorted(codes - set(problems)))
        raise CatalogError(f"{kind}/{name}: names problem codes {kind} does not have: {unknown}")
    success = op.get("success")
    return Operation(
        product=kind,
        name=name,
        method=op["method"],
        path=op["path"],
        effect=Effect(op["effect"]),
        idempotency_key=op["idempotencyKey"],
        recovery=Recovery(op["recovery"]),
        receipt=_receipt(op.get("receipt")),
        request_schema=op["request"],
        response_schema=op["response"],
        descriptor=op,
        bound=tuple(bound),
        success=frozenset(success) if success is not None else None,
        refusals=frozenset(op.get("refusals", DEFAULT_REFUSALS)),
        refused_codes=frozenset(op.get("refusedCodes", ())),
        spent_codes=frozenset(op.get("spentCodes", ())),
        prepare=op.get("prepare"),
        grant=op.get("grant"),
        external=op.get("external", False),
    )


def _receipt(value: JSON) -> Receipt | None:
    """A receipt lookup; an older descriptor's is a GET path naming ``{key}``, whose 404
    is read as any newer lookup's unresolved answer: not evidence of absence."""
    if value is None:
        return None
    if isinstance(value, str):
        return Receipt("GET", value, frozenset({404}))
    return Receipt(value["method"], value["path"], frozenset(value["unresolved"]))


def _result(kind: str, name: str, res: JSON, operations: dict[str, Operation]) -> Result:
    fetch = operations.get(res["fetch"])
    if fetch is None or fetch.effect is not Effect.READ:
        raise CatalogError(f"{kind}/{name}: fetch must name a read operation of {kind}")
    if res["fetchInput"] not in fetch.path_params:
        raise CatalogError(f"{kind}/{name}: fetchInput must be a path parameter of the fetch")
    delivery = res.get("delivery", {})
    push = delivery.get("push")
    feed = delivery.get("feed")
    return Result(
        product=kind,
        name=name,
        key=res["key"],
        fetch=fetch,
        fetch_input=res["fetchInput"],
        finals=_finals(res["final"]),
        descriptor=res,
        pending=frozenset(res.get("pending", ())),
        gone={int(status): Gone(what) for status, what in res.get("gone", {}).items()},
        push=Push(push["event"], push["key"], push["eventId"]) if push else None,
        feed=Feed(
            feed["path"],
            feed["cursor"],
            feed["limit"],
            feed["items"],
            feed["next"],
            feed["key"],
            feed["eventId"],
        )
        if feed
        else None,
        read_only="delivery" in res and not push and not feed,
    )


def _finals(value: JSON) -> tuple[Mapping[str, frozenset[str]], ...]:
    """A result's final conditions; an older descriptor's is one ``{field, values}``."""
    if isinstance(value, dict):
        return ({value["field"]: frozenset(value["values"])},)
    return tuple({f: frozenset(v) for f, v in condition.items()} for condition in value)
