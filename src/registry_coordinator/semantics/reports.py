"""Subject reports: what the service did for one data subject, as an extract signed with
the audit key and checked offline with the public key alone, as a bundle is.

An extract is one line of canonical JSON, ``{"format", "key", "report", "signature"}``:
the signature is Ed25519 over a fixed label and the canonical text of ``report``, and
``key`` names the signer (its raw public key in hex). :func:`check` refuses any other
spelling of the same content, so a changed byte either changes what the signature covers
or leaves text that is not the canonical form.

An archived run keeps no sendings, only its history: :func:`sendings` reads from its events
what it sent and what became of each request, in the shape the report gives a run's
sendings in the database — without the product's answer, which left with the hot tables.
Pure: no database, no configuration.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from decimal import Decimal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.semantics.bundles import Refused
from registry_coordinator.semantics.chain import Event, canonical, parse
from registry_coordinator.semantics.checkpoints import key_id

FORMAT = "registry-coordinator.subject-report/v1"
_KEYS = {"format", "key", "report", "signature"}
_LABEL = b"registry-coordinator/subject-report/1\n"
_HEX64 = re.compile(r"[0-9a-f]{128}")  # one spelling of a signature: bytes.fromhex takes A-F too


def write(report: JSON, key: Ed25519PrivateKey) -> bytes:
    """``report`` as an extract signed with ``key``: its numbers as the chain writes them
    (a product's answer may hold a fraction), one line."""
    content = parse(json.dumps(report))
    signature = key.sign(_LABEL + canonical(content).encode("utf-8"))
    document = {
        "format": FORMAT,
        "key": key_id(key.public_key()),
        "report": content,
        "signature": signature.hex(),
    }
    return (canonical(document) + "\n").encode("utf-8")


def check(data: bytes, key: Ed25519PublicKey) -> JSON:
    """The report the extract ``data`` holds, signed by ``key``; :class:`Refused` saying
    why otherwise."""
    try:
        text = data.decode("utf-8")
        document = parse(text)
        written = canonical(document) + "\n"
    except UnicodeDecodeError:
        raise Refused("it is not a subject report: not UTF-8 text") from None
    except (ValueError, TypeError) as exc:
        raise Refused(f"it is not a subject report: {exc}") from None
    except RecursionError:
        raise Refused("it is not a subject report: it nests deeper than one does") from None
    if not isinstance(document, dict) or set(document) != _KEYS:
        raise Refused(f"a subject report must have exactly the fields {', '.join(sorted(_KEYS))}")
    if document["format"] != FORMAT:
        raise Refused(f"its format is {document['format']!r}, and this reads {FORMAT}")
    if written != text:
        raise Refused("it is not in the canonical form it was written in: it was changed")
    if document["key"] != key_id(key):
        raise Refused("it was signed by another key than the one given")
    signature = document["signature"]
    if not isinstance(signature, str) or not _HEX64.fullmatch(signature):
        raise Refused("its signature is not what the format says (lower-case hex)")
    try:
        key.verify(
            bytes.fromhex(signature),
            _LABEL + canonical(document["report"]).encode("utf-8"),
        )
    except (InvalidSignature, ValueError):
        raise Refused("its signature does not hold: it was changed since it was signed") from None
    report: JSON = document["report"]
    return report


#: What each event that settles a request says became of it, as the report words it.
_SETTLED = {"call-answered": "answered", "call-not-sent": "not sent", "call-lost": "unknown"}


def _count(value: JSON) -> JSON:
    """An attempt or a status as JSON writes it: a bundle's parser reads numbers as
    :class:`~decimal.Decimal`, and these are whole."""
    return int(value) if isinstance(value, Decimal) and value == int(value) else value


def sendings(events: Iterable[Event]) -> list[JSON]:
    """The requests a history says its run sent, in order: each ``call-dispatched``, with
    what the event settling the same step's attempt says became of it (``unknown`` if
    none did) and a late answer's status. ``events``' details as their readers see them
    (a sealed URL opened, or null once erased)."""
    sent: dict[tuple[str, object], dict[str, JSON]] = {}
    for event in events:
        detail = event.detail if isinstance(event.detail, dict) else {}
        at = (event.step, _count(detail.get("attempt")))
        if event.kind == "call-dispatched":
            sent[at] = {
                "step": event.step,
                "attempt": at[1],
                "method": detail.get("method"),
                "url": detail.get("url"),
                "idempotencyKey": None,  # a history does not name it
                "sealedAt": event.at,
                "dispatchedAt": event.at,
                "settledAt": None,
                "effect": "unknown",
                "status": None,
                "answer": None,
                "lateAnswer": None,
            }
        elif at in sent and event.kind in _SETTLED and sent[at]["settledAt"] is None:
            sent[at] |= {
                "settledAt": event.at,
                "effect": _SETTLED[event.kind],
                "status": _count(detail.get("status")),
            }
        elif at in sent and event.kind == "late-answer":
            sent[at]["lateAnswer"] = {
                "status": detail.get("status"),
                "at": event.at,
                "answer": None,
            }
    return list(sent.values())
