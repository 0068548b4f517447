"""Audit bundles: one run's whole history, proven offline with only a public key.

A bundle holds a run's events with their hashes, the workflow artifact it ran under, a
signed checkpoint and the inclusion proof of the run's head in that checkpoint's tree.
:func:`check` needs nothing else — no database, no configuration — to show that the
history is the one that was written, that its first event names the artifact's digest,
and that the key's holder signed its head.

An auditor's bundle (``audit export --record``) also holds the run's record — its input,
outputs, output and deadline, in clear, for an auditor trusted with them — signed with
the same key over the run and its last event's hash, for :mod:`replay` to take the run's
decisions again. Archived bundles never hold one: what they keep of a person stays
sealed, and is erased with its key.

A bundle is one line of the chain's canonical JSON, and :func:`check` refuses any other
spelling of the same content, so every byte counts: a changed byte either changes what
a hash, the digest or the signature covers, or leaves text that is not the canonical
form. Hex is lower case and numbers are whole where the format says so, for the same
reason.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.semantics.chain import Event, canonical, first_break, parse
from registry_coordinator.semantics.checkpoints import Checkpoint, Leaf, proven_root, signed_by
from registry_coordinator.semantics.replay import Record

FORMAT = "registry-coordinator.audit-bundle/v1"
_KEYS = {"artifact", "checkpoint", "events", "format", "proof", "run"}
_EVENT = {"actor", "at", "detail", "hash", "seq", "step", "type"}
_CHECKPOINT = {"at", "key", "leaves", "number", "previous", "root", "signature"}
_PROOF = {"index", "path", "seq"}
_RECORD = {"deadline", "input", "output", "outputs", "signature"}
_RECORD_LABEL = b"registry-coordinator/bundle-record/1\n"
_HEX32 = re.compile(r"[0-9a-f]{64}")
_HEX64 = re.compile(r"[0-9a-f]{128}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def write(
    run: str,
    events: Sequence[Event],
    artifact: bytes,
    checkpoint: Checkpoint,
    seq: int,
    index: int,
    path: Sequence[bytes],
    record: dict[str, JSON] | None = None,
) -> bytes:
    """The bundle of ``run``: its events, the artifact, and ``checkpoint``, whose leaf
    ``index`` is the run's head at event ``seq`` with ``path`` as its proof; and, in an
    auditor's bundle, the run's ``record`` as :func:`signed_record` signed it."""
    document: dict[str, JSON] = {
        "artifact": artifact.decode("utf-8"),
        "checkpoint": checkpoint.as_json(),
        "events": [
            {
                "actor": e.actor,
                "at": e.at,
                "detail": e.detail,
                "hash": e.hash.hex(),
                "seq": e.seq,
                "step": e.step,
                "type": e.kind,
            }
            for e in events
        ],
        "format": FORMAT,
        "proof": {"index": index, "path": [p.hex() for p in path], "seq": seq},
        "run": run,
    }
    if record is not None:
        document["record"] = record
    return (canonical(document) + "\n").encode("utf-8")


def _record_statement(run: str, head: str, record: dict[str, JSON]) -> bytes:
    covered = {k: record[k] for k in _RECORD - {"signature"}}
    return _RECORD_LABEL + canonical({**covered, "head": head, "run": run}).encode("utf-8")


def signed_record(key: Ed25519PrivateKey, run: str, head: bytes, record: Record) -> dict[str, JSON]:
    """``record`` as an auditor's bundle holds it, in clear, signed with ``key`` together
    with the run and the hash of the history's last event (``head``), so that a record
    cannot be moved to another run or to another state of its history."""
    content = parse(
        json.dumps(
            {
                "deadline": record.deadline,
                "input": record.input,
                "output": record.output,
                "outputs": record.outputs,
            }
        )
    )
    assert isinstance(content, dict)
    signature = key.sign(_record_statement(run, head.hex(), content))
    return {**content, "signature": signature.hex()}


def _record(run: str, head: bytes, value: object, key: Ed25519PublicKey) -> Record:
    r = _mapping(value, _RECORD, "the record")
    try:
        key.verify(
            bytes.fromhex(_text(r["signature"], "the record's signature", _HEX64)),
            _record_statement(run, head.hex(), r),
        )
    except InvalidSignature:
        raise Refused(
            "the record's signature does not hold for this run and its last event"
        ) from None
    outputs = r["outputs"]
    if not isinstance(outputs, dict):
        raise Refused("the record's outputs must be a mapping of step ids to outputs")
    return Record(
        _plain(r["input"]),
        {step: _plain(v) for step, v in outputs.items()},
        _plain(r["output"]),
        _text(r["deadline"], "the record's deadline"),
    )


def _plain(value: JSON) -> JSON:
    """A value as the engine reads one from the database (numbers as int or float), not as
    the chain's canonical form parses it (Decimal)."""
    plain: JSON = json.loads(canonical(value))
    return plain


class Refused(ValueError):
    """The bundle does not prove what it holds; the message says where and why."""


@dataclass(frozen=True)
class Proven:
    """What a bundle showed."""

    run: str
    events: int
    workflow: str
    version: str
    digest: str
    last: str  # the last event's type: how the run ended, if it did
    signed: int  # events 1..signed are under the checkpoint's signature
    checkpoint: int
    checkpoint_at: str
    history: tuple[Event, ...] = field(default=(), repr=False, compare=False)
    artifact: bytes = field(default=b"", repr=False, compare=False)
    record: Record | None = field(default=None, repr=False)  # an auditor's bundle's


def _mapping(value: object, keys: set[str], what: str) -> dict[str, JSON]:
    if not isinstance(value, dict) or set(value) != keys:
        raise Refused(f"{what} must have exactly the fields {', '.join(sorted(keys))}")
    return value


def _text(value: object, what: str, pattern: re.Pattern[str] | None = None) -> str:
    if not isinstance(value, str) or (pattern is not None and not pattern.fullmatch(value)):
        raise Refused(f"{what} is not what the format says" + (" (lower-case hex)" * bool(pattern)))
    return value


def _whole(value: object, what: str) -> int:
    if not isinstance(value, Decimal) or value != value.to_integral_value() or value < 0:
        raise Refused(f"{what} must be a whole number")
    return int(value)


def _events(run: str, items: object) -> list[Event]:
    if not isinstance(items, list) or not items:
        raise Refused("events must be a list of the run's events")
    events = []
    for n, item in enumerate(items, 1):
        e = _mapping(item, _EVENT, f"event {n}")
        events.append(
            Event(
                run,
                _whole(e["seq"], f"event {n}'s seq"),
                _text(e["at"], f"event {n}'s at"),
                _text(e["type"], f"event {n}'s type"),
                _text(e["step"], f"event {n}'s step"),
                _text(e["actor"], f"event {n}'s actor"),
                e["detail"],
                bytes.fromhex(_text(e["hash"], f"event {n}'s hash", _HEX32)),
            )
        )
    return events


def read_checkpoint(value: object) -> Checkpoint:
    """A checkpoint as a bundle, or a copy kept elsewhere, holds it (parsed JSON)."""
    c = _mapping(value, _CHECKPOINT, "the checkpoint")
    previous = c["previous"]
    return Checkpoint(
        _whole(c["number"], "the checkpoint's number"),
        _text(c["at"], "the checkpoint's at"),
        None if previous is None else _text(previous, "the checkpoint's previous", _HEX32),
        bytes.fromhex(_text(c["root"], "the checkpoint's root", _HEX32)),
        _whole(c["leaves"], "the checkpoint's leaves"),
        _text(c["key"], "the checkpoint's key", _HEX32),
        bytes.fromhex(_text(c["signature"], "the checkpoint's signature", _HEX64)),
    )


def named_key(data: bytes) -> Ed25519PublicKey:
    """The key the bundle ``data``'s checkpoint names as its signer: a check against it
    shows the bundle is whole and self-consistent, not who signed it."""
    try:
        document = parse(data.decode("utf-8"))
        named = document["checkpoint"]["key"]
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(named))
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, RecursionError):
        raise Refused("it is not a bundle: its checkpoint names no Ed25519 key") from None


def check(data: bytes, key: Ed25519PublicKey) -> Proven:
    """What the bundle ``data`` proves under ``key``; :class:`Refused` if it does not."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("it is not a bundle: not UTF-8 text") from None
    try:
        document = parse(text)
    except ValueError as exc:
        raise Refused(f"it is not a bundle: {exc}") from None
    except RecursionError:
        raise Refused("it is not a bundle: it nests deeper than any bundle does") from None
    if not isinstance(document, dict):
        raise Refused(f"a bundle must have exactly the fields {', '.join(sorted(_KEYS))}")
    root = _mapping(document, _KEYS | ({"record"} & set(document)), "a bundle")
    if _text(root["format"], "format") != FORMAT:
        raise Refused(f"its format is {root['format']!r}, and this reads {FORMAT}")
    try:
        written = canonical(document) + "\n"
    except RecursionError:  # a list in a list ... deeper than a bundle ever nests
        raise Refused("it is not a bundle: it nests deeper than any bundle does") from None
    if written != text:
        raise Refused("it is not in the canonical form it was written in: it was changed")
    run = _text(root["run"], "run", _UUID)
    events = _events(run, root["events"])
    broken = first_break(run, events, len(events))
    if broken is not None:
        raise Refused(f"run {run}: event {broken.seq}: {broken.why}")
    admitted = events[0].detail
    if events[0].kind != "admitted" or not isinstance(admitted, dict):
        raise Refused("event 1 is not the run's admission")
    artifact = _text(root["artifact"], "artifact").encode("utf-8")
    digest = "sha256:" + hashlib.sha256(artifact).hexdigest()
    if admitted.get("digest") != digest:
        raise Refused(f"the artifact's digest is {digest}, not the one event 1 names")
    checkpoint = read_checkpoint(root["checkpoint"])
    proof = _mapping(root["proof"], _PROOF, "the proof")
    seq = _whole(proof["seq"], "the proof's seq")
    index = _whole(proof["index"], "the proof's index")
    if not isinstance(proof["path"], list):
        raise Refused("the proof's path must be a list")
    path = [bytes.fromhex(_text(p, "a proof hash", _HEX32)) for p in proof["path"]]
    if not 1 <= seq <= len(events):
        raise Refused(f"the proof is of event {seq}, which the bundle does not hold")
    leaf = Leaf(run, seq, events[seq - 1].hash)
    if proven_root(leaf.hash(), index, checkpoint.leaves, path) != checkpoint.root:
        raise Refused(
            f"the proof does not lead from event {seq}'s hash to checkpoint "
            f"{checkpoint.number}'s root"
        )
    why = signed_by(checkpoint, key)
    if why is not None:
        raise Refused(f"checkpoint {checkpoint.number}: {why}")
    record = _record(run, events[-1].hash, root["record"], key) if "record" in root else None
    return Proven(
        run,
        len(events),
        str(admitted.get("workflow")),
        str(admitted.get("version")),
        digest,
        events[-1].kind,
        seq,
        checkpoint.number,
        checkpoint.at,
        tuple(events),
        artifact,
        record,
    )
