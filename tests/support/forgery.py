"""A key holder's forgery: a bundle changed and then signed again, whole, with the key that
signed it, so that only what signatures cannot show — whether the history follows from
its record — can catch it."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry_coordinator.semantics import bundles
from registry_coordinator.semantics.chain import Event, canonical, event_hash
from registry_coordinator.semantics.checkpoints import Leaf, sign
from registry_coordinator.semantics.replay import Record


def _plain(value: Any) -> Any:
    return json.loads(canonical(value))


def chained(run: str, drafts: list[tuple[str, str, str, str, Any]]) -> list[Event]:
    """Events 1.. of ``run`` from (at, type, step, actor, detail), each hash chained to
    the one before as the database writes it."""
    events: list[Event] = []
    previous: bytes | None = None
    for seq, (at, kind, step, actor, detail) in enumerate(drafts, 1):
        draft = Event(run, seq, at, kind, step, actor, detail, b"")
        previous = event_hash(previous, draft)
        events.append(replace(draft, hash=previous))
    return events


def resigned(document: dict[str, Any], key: Ed25519PrivateKey) -> bytes:
    """The bundle ``document`` (parsed, perhaps changed) written again with every event's
    hash chained anew, a checkpoint of its head alone and its record signed again."""
    run = document["run"]
    events: list[Event] = []
    previous: bytes | None = None
    for e in document["events"]:
        draft = Event(
            run, int(e["seq"]), e["at"], e["type"], e["step"], e["actor"], e["detail"], b""
        )
        previous = event_hash(previous, draft)
        events.append(replace(draft, hash=previous))
    kept = document["checkpoint"]
    checkpoint = sign(
        key,
        int(kept["number"]),
        kept["at"],
        kept["previous"],
        [Leaf(run, len(events), previous or b"")],
    )
    record = document.get("record")
    signed = None
    if record is not None:
        held = Record(
            _plain(record["input"]),
            _plain(record["outputs"]),
            _plain(record["output"]),
            record["deadline"],
        )
        signed = bundles.signed_record(key, run, events[-1].hash, held)
    artifact = document["artifact"].encode("utf-8")
    return bundles.write(run, events, artifact, checkpoint, len(events), 0, [], signed)
