"""semantics/bundles without the database: a bundle written from a chained history and a
signed checkpoint proves the run with nothing but the public key, and any change to it —
any one byte, another spelling of the same JSON, a history rewritten with every hash
recomputed — is refused in one line that says what is wrong."""

from __future__ import annotations

import datetime
import hashlib
import json
import uuid
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given
from hypothesis import strategies as st

from registry_coordinator.semantics import bundles
from registry_coordinator.semantics.chain import (
    ENDS,
    Event,
    canonical,
    first_break,
    parse,
)
from registry_coordinator.semantics.checkpoints import Checkpoint, Leaf, inclusion, sign
from tests.support import chained

# Fixed seeds, so a failing example replays with the same signatures.
KEY = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"test_bundles: signer").digest())
OTHER = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"test_bundles: other").digest())
PUBLIC = KEY.public_key()


def admission(artifact: bytes, workflow: str = "deliver", version: str = "3") -> dict[str, str]:
    return {
        "workflow": workflow,
        "version": version,
        "digest": "sha256:" + hashlib.sha256(artifact).hexdigest(),
    }


@dataclass(frozen=True)
class Bundle:
    """A written bundle and what it was written from."""

    data: bytes
    run: str
    events: list[Event]
    artifact: bytes
    checkpoint: Checkpoint
    seq: int
    index: int
    path: list[bytes]
    leaves: list[Leaf]


def written(
    run: str,
    events: list[Event],
    artifact: bytes,
    seq: int,
    others: list[Leaf],
    index: int,
    number: int = 7,
    at: str = "2026-12-01T00:05:00Z",
    previous: str | None = None,
) -> Bundle:
    """The bundle of ``events``, signed by KEY at event ``seq`` as leaf ``index`` of a
    checkpoint whose other leaves are ``others``."""
    leaves = [*others[:index], Leaf(run, seq, events[seq - 1].hash), *others[index:]]
    checkpoint = sign(KEY, number, at, previous, leaves)
    path = inclusion([leaf.hash() for leaf in leaves], index)
    data = bundles.write(run, events, artifact, checkpoint, seq, index, path)
    return Bundle(data, run, events, artifact, checkpoint, seq, index, path, leaves)


# RFC 3339 instants from whole seconds: a datetimes() draw costs ten times as much.
INSTANTS = st.integers(1_600_000_000, 2_000_000_000).map(
    lambda s: datetime.datetime.fromtimestamp(s, datetime.UTC).isoformat().replace("+00:00", "Z")
)
NAMES = st.text(max_size=12)
DETAIL_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.decimals(-(10**9), 10**9, places=3, allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=4,
)
# What parse() gives back for a detail: numbers as Decimals, as a bundle's reader sees them.
DETAILS = st.dictionaries(NAMES, DETAIL_VALUES, max_size=3).map(lambda d: parse(canonical(d)))
# Kinds a run goes on after: an event after an end is refused (test_chain.py).
KINDS = st.sampled_from(
    ["step.started", "step.completed", "call.sent", "call.answered", "completed", "held"]
)
# The other runs' heads in the checkpoint, each from one draw of 32 bytes.
OTHER_LEAVES = st.lists(
    st.binary(min_size=32, max_size=32).map(
        lambda h: Leaf(str(uuid.UUID(bytes=h[:16], version=4)), 1 + h[16], h)
    ),
    max_size=12,
)


@st.composite
def bundles_of(draw: st.DrawFn, grown: bool = False) -> Bundle:
    """A bundle of a random run; with ``grown``, its history went on after the checkpoint."""
    run = str(draw(st.uuids()))
    artifact = draw(st.text(min_size=1, max_size=60)).encode("utf-8")
    workflow, version = draw(NAMES), draw(NAMES)
    first = (draw(INSTANTS), "admitted", "", draw(NAMES), admission(artifact, workflow, version))
    rest = draw(
        st.lists(
            st.tuples(INSTANTS, KINDS, NAMES, NAMES, DETAILS),
            min_size=1 if grown else 0,
            max_size=6,
        )
    )
    events = chained(run, [first, *rest])
    seq = draw(st.integers(1, len(events) - 1 if grown else len(events)), label="signed seq")
    others = draw(OTHER_LEAVES)
    index = draw(st.integers(0, len(others)), label="index")
    return written(
        run,
        events,
        artifact,
        seq,
        others,
        index,
        number=draw(st.integers(0, 10**9)),
        at=draw(INSTANTS),
        previous=draw(st.none() | st.binary(min_size=32, max_size=32).map(bytes.hex)),
    )


def small() -> Bundle:
    """One fixed bundle of four events, signed at event 3 among five leaves, with text
    outside ASCII so that another spelling of it has something to escape."""
    run = "0f8c2a4e-5b1d-4c3a-9e7f-2d6b8a1c4e90"
    artifact = b"workflow: deliver\nversion: 3\nsteps: [publish]\n"
    events = chained(
        run,
        [
            ("2026-12-01T00:00:00Z", "admitted", "", "józef", admission(artifact)),
            ("2026-12-01T00:00:01Z", "step.started", "publish", "worker", {}),
            ("2026-12-01T00:00:02Z", "call.sent", "publish", "worker", {"attempt": 1}),
            ("2026-12-01T00:00:03Z", "completed", "", "worker", {"outputs": ["a", 2]}),
        ],
    )
    others = [Leaf(f"00000000-0000-4000-8000-00000000000{n}", n, bytes([n]) * 32) for n in range(4)]
    return written(run, events, artifact, 3, others, 2, previous="ab" * 32)


SMALL = small()


def refused(data: bytes, key: Ed25519PublicKey = PUBLIC) -> str:
    """Why ``check`` refuses ``data``: one line, never empty."""
    with pytest.raises(bundles.Refused) as refusal:
        bundles.check(data, key)
    message = str(refusal.value)
    assert message
    assert "\n" not in message
    return message


def respelled(document: Any) -> bytes:
    """``document`` (as parse() gives it) written canonically: a change to what a bundle
    says, not to how it is spelled."""
    return (canonical(document) + "\n").encode("utf-8")


@given(bundles_of())
def test_a_bundle_proves_its_run_with_only_the_public_key(bundle: Bundle) -> None:
    proven = bundles.check(bundle.data, PUBLIC)
    admitted = bundle.events[0].detail
    assert proven == bundles.Proven(
        run=bundle.run,
        events=len(bundle.events),
        workflow=admitted["workflow"],
        version=admitted["version"],
        digest=admitted["digest"],
        last=bundle.events[-1].kind,
        signed=bundle.seq,
        checkpoint=bundle.checkpoint.number,
        checkpoint_at=bundle.checkpoint.at,
    )
    assert bundle.data.endswith(b"\n")
    assert b"\n" not in bundle.data[:-1]


def test_the_small_bundle_proves_what_it_was_written_from() -> None:
    assert bundles.check(SMALL.data, PUBLIC) == bundles.Proven(
        run=SMALL.run,
        events=4,
        workflow="deliver",
        version="3",
        digest="sha256:" + hashlib.sha256(SMALL.artifact).hexdigest(),
        last="completed",
        signed=3,
        checkpoint=7,
        checkpoint_at="2026-12-01T00:05:00Z",
    )


@given(bundles_of(grown=True))
def test_events_after_the_checkpoint_are_chained_but_not_signed(bundle: Bundle) -> None:
    proven = bundles.check(bundle.data, PUBLIC)
    assert proven.signed == bundle.seq < proven.events == len(bundle.events)


@given(bundles_of(), st.data())
def test_changing_any_one_byte_is_refused(bundle: Bundle, data: st.DataObject) -> None:
    position = data.draw(st.integers(0, len(bundle.data) - 1), label="position")
    original = bundle.data[position]
    byte = data.draw(st.integers(0, 255).filter(lambda b: b != original), label="byte")
    changed = bundle.data[:position] + bytes([byte]) + bundle.data[position + 1 :]
    refused(changed)


@pytest.mark.parametrize("mask", [0x01, 0x20], ids=["low bit", "letter case"])
def test_changing_any_one_byte_of_a_small_bundle_is_refused(mask: int) -> None:
    """Every position of SMALL (1.7 kB), not a stride: 0x20 turns hex and key
    letters upper case, and spaces into NULs."""
    for position in range(len(SMALL.data)):
        changed = bytearray(SMALL.data)
        changed[position] ^= mask
        refused(bytes(changed))


def test_another_key_is_refused_naming_the_key() -> None:
    why = refused(SMALL.data, OTHER.public_key())
    assert why.startswith("checkpoint 7: it names the key ")


def test_an_artifact_other_than_the_one_admitted_is_refused() -> None:
    other = SMALL.artifact.replace(b"3", b"4")
    data = bundles.write(
        SMALL.run, SMALL.events, other, SMALL.checkpoint, SMALL.seq, SMALL.index, SMALL.path
    )
    digest = "sha256:" + hashlib.sha256(other).hexdigest()
    assert refused(data) == f"the artifact's digest is {digest}, not the one event 1 names"


def compact(document: Any) -> str:
    """``document`` in JSON as canonical() writes it, by another writer."""
    return json.dumps(document, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


@pytest.mark.parametrize(
    "spelling",
    [
        lambda d: json.dumps(d, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
        lambda d: json.dumps(d, sort_keys=True, ensure_ascii=False) + "\n",
        lambda d: json.dumps(d, separators=(",", ":"), sort_keys=True) + "\n",  # \u escapes
        lambda d: json.dumps(d, separators=(",", ":"), ensure_ascii=False) + "\n",  # unsorted
        compact,
        lambda d: compact(d) + "\r\n",
        lambda d: compact(d) + " ",  # one byte changed, and only the spelling checks it
        lambda d: " " + compact(d) + "\n",
    ],
    ids=[
        "indented",
        "spaced",
        "ascii escapes",
        "unsorted",
        "no newline",
        "crlf",
        "space for newline",
        "leading space",
    ],
)
def test_another_spelling_of_the_same_bundle_is_refused(spelling: Any) -> None:
    document = json.loads(SMALL.data)  # SMALL holds whole numbers only: no float is lost
    assert isinstance(document, dict)
    document = dict(reversed(document.items()))  # so that "unsorted" is
    text = spelling(document)
    assert parse(text) == parse(SMALL.data)  # the same content...
    assert refused(text.encode("utf-8")) == (  # ...but not the bytes that were written
        "it is not in the canonical form it was written in: it was changed"
    )


def holder(document: dict[str, Any], where: tuple[Any, ...]) -> tuple[Any, Any]:
    """The container holding the value at path ``where`` and its key there."""
    for step in where[:-1]:
        document = document[step]
    return document, where[-1]


HEX_FIELDS = [
    ("events", 0, "hash"),
    ("events", 3, "hash"),
    ("checkpoint", "root"),
    ("checkpoint", "key"),
    ("checkpoint", "signature"),
    ("checkpoint", "previous"),
    ("proof", "path", 0),
    ("run",),
]


@pytest.mark.parametrize("where", HEX_FIELDS, ids=lambda w: ".".join(map(str, w)))
def test_upper_case_hex_is_refused(where: tuple[Any, ...]) -> None:
    """Upper-case hex names the same bytes (bytes.fromhex reads it), so it would pass
    the hashes and the signature: the format allows only one spelling."""
    document = parse(SMALL.data)
    container, key = holder(document, where)
    container[key] = container[key].upper()
    why = refused(respelled(document))
    assert why.endswith("is not what the format says (lower-case hex)")


@pytest.mark.parametrize(
    ("where", "value", "named"),
    [
        (("proof", "seq"), Decimal("3.5"), "the proof's seq"),
        (("proof", "seq"), "3", "the proof's seq"),
        (("proof", "index"), Decimal("-1"), "the proof's index"),
        (("proof", "index"), Decimal("2.5"), "the proof's index"),
        (("events", 1, "seq"), Decimal("2.5"), "event 2's seq"),
        (("events", 1, "seq"), True, "event 2's seq"),
        (("checkpoint", "number"), Decimal("7.5"), "the checkpoint's number"),
        (("checkpoint", "leaves"), None, "the checkpoint's leaves"),
    ],
)
def test_a_number_that_must_be_whole_is_refused(
    where: tuple[Any, ...], value: Any, named: str
) -> None:
    document = parse(SMALL.data)
    container, key = holder(document, where)
    container[key] = value
    assert refused(respelled(document)) == f"{named} must be a whole number"


@pytest.mark.parametrize(
    ("where", "named"),
    [
        ((), "a bundle"),
        (("events", 0), "event 1"),
        (("events", 2), "event 3"),
        (("checkpoint",), "the checkpoint"),
        (("proof",), "the proof"),
    ],
)
@pytest.mark.parametrize("change", ["added", "removed"])
def test_an_unknown_or_missing_field_is_refused(
    where: tuple[Any, ...], named: str, change: str
) -> None:
    document = parse(SMALL.data)
    mapping = document
    for step in where:
        mapping = mapping[step]
    if change == "added":
        mapping["note"] = "added"
    else:
        del mapping[sorted(mapping)[-1]]
    assert refused(respelled(document)).startswith(f"{named} must have exactly the fields ")


def _written(bundle: Bundle, events: list[Event]) -> bytes:
    """The bundle's bytes with ``events`` in place of its own, all else kept."""
    return bundles.write(
        bundle.run,
        events,
        bundle.artifact,
        bundle.checkpoint,
        bundle.seq,
        bundle.index,
        bundle.path,
    )


def _rewritten(bundle: Bundle, seq: int) -> list[Event]:
    """The bundle's history with event ``seq``'s detail changed and every hash recomputed."""
    events = [
        (
            e.at,
            e.kind,
            e.step,
            e.actor,
            {**e.detail, "rewritten": True} if e.seq == seq else e.detail,
        )
        for e in bundle.events
    ]
    return chained(bundle.run, events)


@given(bundles_of(), st.data())
def test_a_history_rewritten_with_every_hash_recomputed_is_refused(
    bundle: Bundle, data: st.DataObject
) -> None:
    """The chain holds after the rewrite, since every hash was made again; the head the
    checkpoint signed is no longer the head the history leads to."""
    seq = data.draw(st.integers(1, bundle.seq), label="rewritten event")
    rewritten = _rewritten(bundle, seq)
    assert first_break(bundle.run, rewritten, len(rewritten)) is None
    forged = _written(bundle, rewritten)
    assert refused(forged) == (
        f"the proof does not lead from event {bundle.seq}'s hash to checkpoint "
        f"{bundle.checkpoint.number}'s root"
    )


def test_a_rewrite_that_also_rebuilds_the_tree_has_no_signature() -> None:
    """The rewriter can make the tree again, but not the signature over its root."""
    events = [
        (e.at, e.kind, e.step, e.actor, {**e.detail, "attempt": 2} if e.seq == 3 else e.detail)
        for e in SMALL.events
    ]
    rewritten = chained(SMALL.run, events)
    leaves = list(SMALL.leaves)
    leaves[SMALL.index] = Leaf(SMALL.run, SMALL.seq, rewritten[SMALL.seq - 1].hash)
    resigned = sign(OTHER, 7, SMALL.checkpoint.at, SMALL.checkpoint.previous, leaves)
    forged = replace(resigned, key=SMALL.checkpoint.key)  # claims the real key
    path = inclusion([leaf.hash() for leaf in leaves], SMALL.index)
    data = bundles.write(SMALL.run, rewritten, SMALL.artifact, forged, SMALL.seq, SMALL.index, path)
    assert refused(data) == "checkpoint 7: its signature does not hold for what it says"


@given(bundles_of(grown=True), st.data())
def test_events_after_the_signed_one_are_only_chained(bundle: Bundle, data: st.DataObject) -> None:
    """What a bundle does not prove, so that Proven.signed is read for what it is: events
    after the signed one may be rewritten, hashes and all, and the bundle still holds."""
    seq = data.draw(st.integers(bundle.seq + 1, len(bundle.events)), label="rewritten event")
    forged = _written(bundle, _rewritten(bundle, seq))
    assert bundles.check(forged, PUBLIC).signed == bundle.seq


@given(bundles_of(), st.sampled_from(sorted(ENDS)))
def test_a_history_grown_past_its_signed_end_is_refused(bundle: Bundle, end: str) -> None:
    """Mallory's forgery: the signed head is the run's end, and one event is chained
    after it by someone who can write the table. The chain and the proof hold."""
    drafts = [(e.at, e.kind, e.step, e.actor, e.detail) for e in bundle.events]
    drafts[bundle.seq - 1 :] = [
        (bundle.events[bundle.seq - 1].at, end, "end", "coordinator", {}),
        (bundle.events[bundle.seq - 1].at, "cancelled", "end", "operator:mallory", {}),
    ]
    grown = chained(bundle.run, drafts)
    forged = written(bundle.run, grown, bundle.artifact, bundle.seq, [], 0)
    assert refused(forged.data) == (
        f"run {bundle.run}: event {bundle.seq + 1}: it follows the run's end, event "
        f"{bundle.seq} ({end}): nothing is written after a run ends"
    )


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            lambda d: d.update(events=d["events"][:2]),
            "the proof is of event 3, which the bundle does not hold",
        ),
        (
            lambda d: d["events"].pop(1),
            f"run {SMALL.run}: event 2: event 2 is missing",
        ),
        (lambda d: d["events"].clear(), "events must be a list of the run's events"),
        (
            lambda d: d["events"][0].update(type="started"),
            f"run {SMALL.run}: event 1: its hash does not match what it holds",
        ),
        (
            lambda d: d.update(format="audit-bundle/v0"),
            "its format is 'audit-bundle/v0', and this reads registry-coordinator.audit-bundle/v1",
        ),
        (
            lambda d: d["proof"].update(path=d["proof"]["path"][:-1]),
            "the proof does not lead from event 3's hash to checkpoint 7's root",
        ),
        (lambda d: d["proof"].update(path="none"), "the proof's path must be a list"),
    ],
    ids=[
        "signed event dropped",
        "event removed",
        "no events",
        "type changed",
        "format",
        "short path",
        "path not a list",
    ],
)
def test_each_refusal_names_what_is_wrong(change: Any, why: str) -> None:
    document = parse(SMALL.data)
    change(document)
    assert refused(respelled(document)) == why


@given(st.binary(max_size=300))
def test_any_bytes_are_refused_not_crashed_on(data: bytes) -> None:
    refused(data)


@pytest.mark.parametrize(
    "data",
    [
        SMALL.data.replace(b'"index":2', b'"index":NaN'),
        SMALL.data.replace(b'"leaves":5', b'"leaves":Infinity'),
        SMALL.data.replace(b'"attempt":1', b'"attempt":-Infinity'),
        b"[" * 100_000 + b"]" * 100_000 + b"\n",
        SMALL.data.replace(b'"outputs":["a",2]', b'"outputs":' + b"[" * 500 + b"]" * 500),
    ],
    ids=["NaN", "Infinity", "-Infinity", "too deep to parse", "too deep to write"],
)
def test_json_that_python_reads_but_the_format_has_no_place_for_is_refused(data: bytes) -> None:
    """Python's json reads NaN and ±Infinity (as floats) and fails on deep nesting with
    RecursionError; 500 levels parse, but are more than canonical() can write back
    within the recursion limit. A bundle from anywhere gets a refusal, not a traceback."""
    assert data != SMALL.data
    refused(data)


@given(
    st.builds(
        lambda number, at, previous, leaves: sign(KEY, number, at, previous, leaves),
        st.integers(0, 10**9),
        INSTANTS,
        st.none() | st.binary(min_size=32, max_size=32).map(bytes.hex),
        OTHER_LEAVES.filter(bool),
    )
)
def test_a_checkpoint_reads_back_from_its_json(checkpoint: Checkpoint) -> None:
    kept = canonical(checkpoint.as_json())
    assert bundles.read_checkpoint(parse(kept)) == checkpoint


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("root", "AB" * 32, "the checkpoint's root is not what the format says (lower-case hex)"),
        (
            "signature",
            "ab" * 32,
            "the checkpoint's signature is not what the format says (lower-case hex)",
        ),
        ("previous", "", "the checkpoint's previous is not what the format says (lower-case hex)"),
        ("number", Decimal("1.5"), "the checkpoint's number must be a whole number"),
        ("at", Decimal(1), "the checkpoint's at is not what the format says"),
        (
            "extra",
            1,
            "the checkpoint must have exactly the fields at, key, leaves, number, "
            "previous, root, signature",
        ),
    ],
)
def test_a_checkpoint_kept_elsewhere_is_read_only_in_its_format(
    field: str, value: Any, why: str
) -> None:
    kept = parse(canonical(SMALL.checkpoint.as_json()))
    kept[field] = value
    with pytest.raises(bundles.Refused) as refusal:
        bundles.read_checkpoint(kept)
    assert str(refusal.value) == why
