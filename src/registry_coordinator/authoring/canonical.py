"""Canonical JSON, and the one strict reading of JSON that comes from outside.

Canonical JSON is the one byte form an artifact's digest is taken over: sorted
keys, no insignificant whitespace, UTF-8 without escaping, integers as integers
and finite floats in Python's shortest round-trip form (which is what RFC 8785
prescribes for the numbers workflows contain). The same data always gives the
same bytes, whatever YAML style or key order it was written in.

JSON from outside — request bodies, webhook deliveries, products' answers and
receipts — is read by :func:`strict_json` only, which refuses what PostgreSQL
could not store or the engine could not evaluate: NaN and Infinity, a NUL
character, an unpaired surrogate, nesting deeper than :data:`MAX_NESTING`. So
whatever it accepts can be stored and used; what it refuses is an invalid answer,
never a statement that fails half-way through recording one.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, NoReturn

from registry_coordinator.errors import CoordinatorError

#: A JSON value as Python holds it (dict, list, str, int, float, bool, None): what the
#: product reads from YAML, requests and products' answers. Named once, used everywhere.
JSON = Any

#: How deep JSON from outside may nest: far beyond any workflow input or product answer,
#: well within what the JSON Schema validator, CEL and the database's jsonb take.
MAX_NESTING = 64


class CanonicalError(CoordinatorError, ValueError):
    """Data that has no canonical JSON form (NaN, non-string keys, sets, ...)."""


class UnusableJson(CoordinatorError, ValueError):
    """JSON from outside that cannot be stored or used; ``reason`` says which rule it broke."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason  # not-json, too-deep or unstorable


def refuse_constant(name: str) -> NoReturn:
    """For ``json.loads``: NaN and Infinity are not JSON numbers (RFC 8259)."""
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is too large for a JSON number")
    return value


def strict_json(data: bytes, max_nesting: int = MAX_NESTING, *, unique_keys: bool = False) -> JSON:
    """Parse JSON text from outside, refusing with :class:`UnusableJson` what cannot be
    stored or used (see the module's docstring); with ``unique_keys``, also an object that
    names a member twice, which two readers could take differently."""
    too_deep = UnusableJson("too-deep", f"arrays and objects nest over {max_nesting} deep")
    try:
        value = json.loads(
            data.decode("utf-8"),
            parse_constant=refuse_constant,
            parse_float=_finite,
            object_pairs_hook=_unique if unique_keys else None,
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise UnusableJson("not-json", f"not JSON: {exc}") from None
    except RecursionError:
        raise too_deep from None
    if nesting(value) > max_nesting:
        raise too_deep
    if not storable(value):
        raise UnusableJson(
            "unstorable",
            "it holds a NUL character (\\u0000) or an unpaired surrogate, which cannot be stored",
        )
    return value


def _unique(pairs: list[tuple[str, JSON]]) -> dict[str, JSON]:
    """For ``json.loads``: an object whose members are each named once."""
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("an object names a member twice")
    return found


def canonical_bytes(data: object) -> bytes:
    try:
        text = json.dumps(
            data,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )
    except (TypeError, ValueError) as exc:
        raise CanonicalError(str(exc)) from None
    return text.encode("utf-8")


def nesting(value: object) -> int:
    """How deep arrays and objects nest in a JSON value (a scalar is 0), counted without
    recursion, so that any depth can be measured and refused."""
    deepest, stack = 0, [(value, 0)]  # each value, and how deep its container is
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            stack.extend(
                (v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def storable(value: object) -> bool:
    """Whether JSON text can be kept in PostgreSQL: no NUL character (text and jsonb refuse
    it) and no unpaired surrogate (not UTF-8)."""
    if isinstance(value, str):
        if "\x00" in value:
            return False
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(storable(k) and storable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(storable(v) for v in value)
    return True


def digest_of(data: bytes) -> str:
    """The content digest in the form operators pin: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()
