"""Canonical JSON: the one byte form an artifact's digest is taken over.

Sorted keys, no insignificant whitespace, UTF-8 without escaping, integers as
integers and finite floats in Python's shortest round-trip form (which is what
RFC 8785 prescribes for the numbers workflows contain). The same data always
gives the same bytes, whatever YAML style or key order it was written in.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


class CanonicalError(ValueError):
    """Data that has no canonical JSON form (NaN, non-string keys, sets, ...)."""


def canonical_bytes(data: Any) -> bytes:
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


def nesting(value: Any) -> int:
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


def storable(value: Any) -> bool:
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
