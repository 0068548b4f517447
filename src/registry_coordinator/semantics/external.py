"""Reads of an operator-configured external HTTP connection (``external-http/external-get``).

An external connection is not a Registry Stack product: its contract is the operator's
review of it, written in the connection's configuration — the relative paths that may
be read under its base URL, the query parameters that may be sent, and a JSON Schema for
the whole answer ``{status, body}`` (:class:`Reviewed`). A workflow names only a path
and query values; it can supply no destination, method, header or body, and nothing is
ever sent but a GET. As the real Rust coordinator's ``external_http.rs`` does:

- an input naming a path or query parameter the review does not list is refused before
  anything is sent (``external-invalid-command``);
- every answer but a redirect is the read's result, ``{status, body}`` (an empty body is
  ``null``), so a workflow can branch on a 404 or a 500; it must fit the reviewed schema
  (``external-invalid-response`` otherwise, as for a body that is not strict JSON — a
  member named twice included — or that exceeds the connection's limit);
- a redirect is never followed (``external-redirect``): it would carry the connection's
  credential, or the workflow's query, somewhere nobody reviewed.

Pure: the engine passes the reply in, so what an answer means is tested without a server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

import jsonschema

from registry_coordinator.authoring.canonical import JSON, UnusableJson, strict_json

#: A reviewed path: relative segments of unreserved characters, none of them ``.`` or
#: ``..`` (which clients and servers would resolve), joined by single slashes.
PATH = re.compile(r"^(?!\.{1,2}(/|$))[A-Za-z0-9._~-]+(/(?!\.{1,2}(/|$))[A-Za-z0-9._~-]+)*$")
#: A reviewed query parameter's name.
QUERY_NAME = re.compile(r"^[A-Za-z0-9._~-]{1,64}$")
#: At most this many paths, and query parameters, in one review (and in one read).
MOST = 16
#: A query value's longest length.
LONGEST_VALUE = 1024
#: What no query value holds: a control character.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: A redirect's statuses: never followed, never a result.
REDIRECTS = range(300, 400)


def target(path: str, query: Mapping[str, str]) -> str:
    """The request target of a read of ``path`` with ``query`` (relative to the base URL,
    whose own path is kept as a prefix): the path as reviewed, the query encoded as data."""
    encoded = urlencode(sorted(query.items()))
    return f"/{path}" + (f"?{encoded}" if encoded else "")


@dataclass(frozen=True)
class Reviewed:
    """What the operator reviewed of an external connection: the paths that may be read,
    the query parameters that may be sent, and the schema every answer must fit."""

    paths: frozenset[str]
    query_parameters: frozenset[str]
    response_schema: JSON
    _validator: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        validator = jsonschema.Draft202012Validator(self.response_schema)
        object.__setattr__(self, "_validator", validator)

    def refusal(self, sealed_target: str) -> str | None:
        """Why a read of ``sealed_target`` is not one the review allows (None if it is):
        checked again on every sending, so a path the operator has since withdrawn is
        never read."""
        path, _, query = sealed_target.partition("?")
        path = path.removeprefix("/")
        if path not in self.paths:
            # The path read may be computed from a run's data: it is not repeated here.
            return "the path read is none of the connection's paths: " + ", ".join(
                sorted(self.paths)
            )
        pairs = parse_qsl(query, keep_blank_values=True)
        if len(pairs) > MOST:
            return f"at most {MOST} query parameters may be sent"
        for name, value in pairs:
            if name not in self.query_parameters:
                return f"query parameter {name!r} is not one the connection allows"
            if len(value) > LONGEST_VALUE or CONTROL.search(value):
                return f"query parameter {name!r} has a value no reviewed read sends"
        return None

    def answer(self, status: int, body: bytes, exceeded: bool) -> JSON | str:
        """The read's result for an answer that is not a redirect, ``{status, body}``; or
        why it cannot be released to the workflow."""
        if exceeded:
            return "the answer exceeds the connection's responseLimit"
        value: JSON = None
        if body:
            try:
                value = strict_json(body, unique_keys=True)
            except UnusableJson as exc:
                return f"the body is not strict JSON ({exc.reason})"
        result = {"status": status, "body": value}
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(result))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(top)"
            # The body's values stay out of the history: only where it failed is said.
            return f"the answer does not fit the connection's responseSchema at {where}"
        return result


def schema_problem(schema: JSON) -> str | None:
    """Why ``schema`` cannot be a reviewed response schema (None if it can): it must be a
    valid JSON Schema 2020-12 that refers to nothing outside itself."""
    if not isinstance(schema, dict):
        return "it must be a JSON Schema object"
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"it is not a JSON Schema 2020-12: {exc.message}"
    stack: list[Any] = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            reference = item.get("$ref", "#")
            if not isinstance(reference, str) or not reference.startswith("#"):
                return f"it refers outside itself ($ref {reference!r}): write the schema whole"
            if "$id" in item or "$dynamicRef" in item:
                return "it declares a schema resource ($id, $dynamicRef): write the schema whole"
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


#: What is known of an external connection offline (``coordinator test``): nothing of its
#: review, so any answer is taken as the catalog's ``{status, body}``.
UNREVIEWED = Reviewed(frozenset(), frozenset(), {})
