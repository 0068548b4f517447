"""What the service did for one data subject: the answer to a subject-access request, and
to "what did the registry send this applicant".

:func:`report` gathers, from the subject's data keys (live and erased), every run sealed
under one — in the database, with its input, output, hold and every request it sent and
what the product answered, or archived, with the bundle that holds its history and the
requests that history says it sent (read from the bundle, once it proves itself with the
audit key: the answers left with the hot tables) — and :func:`extract` signs it with the
audit key (:mod:`semantics.reports`), checked offline with the public key alone. A run
whose key was erased shows only what stays in clear: its ids, states, codes and instants;
what it held is null, as it is for everyone. An archived run whose bundle cannot be read
or does not prove itself is listed with why, and its sendings null: never a guess.

The subject's id is looked up by its keyed hash; the report names it, since it is made
for that person, and nothing about it is logged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.custody import Sealer, Unopenable
from registry_coordinator.semantics import bundles, reports
from registry_coordinator.store.database import Database, Row
from registry_coordinator.store.keys import SubjectUnknown


def _instant(value: datetime | None) -> str | None:
    return None if value is None else format_instant(value)


def _text(body: bytes | None) -> str | None:
    """A product's answer as text (they are JSON), or null: none, or erased."""
    return None if body is None else bytes(body).decode("utf-8", errors="replace")


def _effect(row: Row) -> str:
    """What became of one sending, in words a subject-access answer can use: ``answered``
    (the product answered, with ``status``), ``not sent``, ``cancelled`` before it left,
    or ``unknown``: it may have reached the product, and no answer came back."""
    if row["status"] is not None:
        return "answered"
    if row["outcome"] in ("not-sent", "cancelled"):
        return str(row["outcome"]).replace("-", " ")
    return "unknown" if row["dispatched_at"] is not None else "not sent"


def _sending(row: Row) -> JSON:
    return {
        "step": row["step"],
        "attempt": row["attempt"],
        "method": row["method"],
        "url": row["url"],
        "idempotencyKey": row["idempotency_key"],
        "sealedAt": _instant(row["sealed_at"]),
        "dispatchedAt": _instant(row["dispatched_at"]),
        "settledAt": _instant(row["settled_at"]),
        "effect": _effect(row),
        "status": row["status"],
        "answer": _text(row["response"]),
        "lateAnswer": None
        if row["late_status"] is None
        else {
            "status": row["late_status"],
            "at": _instant(row["late_at"]),
            "answer": _text(row["late_response"]),
        },
    }


def _run(row: Row, erased: set[int]) -> dict[str, JSON]:
    """What the report says of any run of the subject, in the database or archived."""
    return {
        "run": str(row["id"]),
        "workflow": row["workflow_id"],
        "digest": row["digest"],
        "key": row["data_key"],
        "erased": row["data_key"] in erased,
        "state": row["state"],
    }


class _Unread(Exception):
    """Why an archived run's bundle gave no sendings."""


def _archived_sendings(
    row: Row, archive: Path | None, key: Ed25519PublicKey, sealer: Sealer
) -> list[JSON]:
    """What the bundle of the archived run ``row`` says it sent, its URLs opened (null
    once erased); :class:`_Unread` saying why, if the bundle is not at hand or does not
    prove itself the one recorded."""
    if archive is None:
        raise _Unread("the archive is not configured here: give retention: {directory: ...}")
    path = archive / row["bundle"]
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _Unread(f"its bundle {path} cannot be read: {exc.strerror}") from None
    if hashlib.sha256(data).hexdigest() != row["sha256"]:
        raise _Unread(f"its bundle {path} is not the one recorded (sha256 differs)")
    try:
        proven = bundles.check(data, key)
    except bundles.Refused as exc:
        raise _Unread(f"its bundle {path} does not hold: {exc}") from None
    run, data_key = str(row["id"]), row["data_key"]
    try:
        opened = [
            dataclasses.replace(e, detail=sealer.open_detail(run, e.step, e.detail, data_key))
            for e in proven.history
        ]
    except Unopenable as exc:
        raise _Unread(f"its bundle's sealed fields do not open: {exc}") from None
    return reports.sendings(opened)


async def _archived(
    db: Database, rows: list[Row], archive: Path | None, key: Ed25519PublicKey
) -> dict[uuid.UUID, tuple[list[JSON] | None, str | None]]:
    """Each archived run's sendings read from its bundle, or why none were."""
    assert db.sealer is not None
    found: dict[uuid.UUID, tuple[list[JSON] | None, str | None]] = {}
    for row in rows:
        try:
            read = await trio.to_thread.run_sync(_archived_sendings, row, archive, key, db.sealer)
            found[row["id"]] = (read, None)
        except _Unread as exc:
            found[row["id"]] = (None, str(exc))
    return found


async def report(
    db: Database, subject: str, at: datetime, key: Ed25519PublicKey, archive: Path | None
) -> JSON:
    """Everything the service holds and did for ``subject``, as of ``at``, its archived
    runs' bundles read from ``archive`` and proven with the audit public ``key``;
    :class:`SubjectUnknown` if no run was ever sealed for it."""
    if db.sealer is None:
        raise SubjectUnknown("this service seals nothing (no custody keys): it names no subject")
    keys = await db.rows("subject_keys", {"subject": db.sealer.subject_hash(subject)})
    if not keys:
        raise SubjectUnknown("no run was sealed under this subject: check the id")
    ids = [row["id"] for row in keys]
    runs = await db.rows("subject_runs", {"keys": ids})
    sendings: dict[uuid.UUID, list[JSON]] = defaultdict(list)
    for row in await db.rows("subject_sendings", {"keys": ids}):
        sendings[row["id"]].append(_sending(row))
    archived = await db.rows("subject_archived_runs", {"keys": ids})
    from_bundles = await _archived(db, archived, archive, key)
    erased = {row["id"] for row in keys if row["erased_at"] is not None}
    return {
        "subject": subject,
        "at": format_instant(at),
        "keys": [
            {
                "key": row["id"],
                "madeAt": _instant(row["made_at"]),
                "erasedAt": _instant(row["erased_at"]),
                "erasedBy": row["erased_by"],
            }
            for row in keys
        ],
        "runs": [
            _run(row, erased)
            | {
                "step": row["step"],
                "outcome": row["outcome"],
                "failure": row["failure_code"],
                "hold": row["hold_code"],
                "detail": row["detail"],
                "admittedAt": _instant(row["admitted_at"]),
                "endedAt": _instant(row["ended_at"]),
                "input": row["input"],
                "output": row["output"],
                "sendings": sendings.get(row["id"], []),
                "outcomesUnknown": sum(
                    1
                    for sent in sendings.get(row["id"], [])
                    if isinstance(sent, dict) and sent["effect"] == "unknown"
                ),
            }
            for row in runs
        ],
        "archived": [
            _run(row, erased)
            | {
                "outcome": row["outcome"],
                "admittedAt": _instant(row["admitted_at"]),
                "endedAt": _instant(row["ended_at"]),
                "archivedAt": _instant(row["archived_at"]),
                "bundle": row["bundle"],
                "sha256": row["sha256"],
                "sendings": from_bundles[row["id"]][0],
                "unread": from_bundles[row["id"]][1],
            }
            for row in archived
        ],
    }


async def extract(
    db: Database, subject: str, at: datetime, key: Ed25519PrivateKey, archive: Path | None
) -> bytes:
    """:func:`report`, signed with the audit ``key``: one line, checked offline by
    ``coordinator audit verify --report FILE --public-key KEY``."""
    return reports.write(await report(db, subject, at, key.public_key(), archive), key)
