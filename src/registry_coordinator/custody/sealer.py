"""The sealer a store uses: the installation it is in, the data key it seals new values
under, and every key it can open with. JSON values go in and out; what is stored is
the sealed value in base64, a JSON string, so a jsonb or text column and its SQL stay as
they are (``outputs || %(outputs)s`` merges sealed outputs as it merged plain ones). Bytes
(a request's body, a product's answer) go in and out of a bytea column as sealed bytes.

The run's row says whether its values are sealed (``runs.data_key``), never the value's
shape: a run's input may itself be any string.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property, partial

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.custody.sealing import (
    CustodyCode,
    DataKey,
    Kek,
    Place,
    Purpose,
    Unopenable,
    open_sealed,
    seal,
    unwrap,
)

_DIGEST_LABEL = b"registry-coordinator/digest/1"
_SUBJECT_LABEL = b"registry-coordinator/subject/1"


@dataclass(frozen=True)
class Sealer:
    """Seals under ``key``; opens with any of ``keys`` (None for an erased key), which
    grows as the store meets keys it had not unwrapped (:meth:`learn`, with ``keks``).
    The installation's sealer seals under its ``shared`` key; a run whose data is its
    subject's is sealed by :meth:`under` that subject's key."""

    installation: uuid.UUID
    key: DataKey = field(repr=False)
    keys: dict[int, DataKey | None] = field(repr=False)
    keks: Mapping[int, Kek] = field(default_factory=dict, repr=False)
    shared: DataKey | None = field(default=None, repr=False)  # None: ``key`` is the shared
    active: int | None = None  # the KEK version a data key made now is wrapped under

    def under(self, data_key: int) -> Sealer:
        """This sealer sealing under data key ``data_key`` (a run's, :data:`runs.data_key`):
        refused if it is erased or not learnt (the store learns a run's key as it reads
        the run's row)."""
        key = self.keys.get(data_key)
        if key is None:
            code = CustodyCode.ERASED if data_key in self.keys else CustodyCode.UNKNOWN_KEY
            state = "was erased" if code is CustodyCode.ERASED else "is not held"
            raise Unopenable(code, f"data key {data_key} {state}: nothing is sealed under it")
        if key == self.key:
            return self
        return replace(self, key=key, shared=self.shared or self.key)

    def learn(self, data_key: int, kek: int | None, wrapped: bytes | memoryview | None) -> None:
        """Hold data key ``data_key`` as its row gives it (no ``wrapped``: erased)."""
        self.keys[data_key] = (
            None
            if wrapped is None or kek is None
            else unwrap(self.keks, self.installation, data_key, kek, bytes(wrapped))
        )

    def forget(self, data_key: int) -> None:
        """Data key ``data_key`` was erased: nothing opens under it here any more."""
        if data_key in self.keys:
            self.keys[data_key] = None

    def erased(self, data_key: int) -> bool:
        """Whether data key ``data_key`` is known here to be erased."""
        return data_key in self.keys and self.keys[data_key] is None

    def subject_hash(self, subject: str) -> bytes:
        """What ``data_keys.subject`` names ``subject`` by: an HMAC-SHA-256 under a key of
        its own derived from the shared key, so a dump cannot confirm a guessed id."""
        return hmac.new(self._subject_key, subject.encode(), hashlib.sha256).digest()

    def seal(
        self, run: uuid.UUID | str, purpose: Purpose, step: str, value: JSON, part: str = ""
    ) -> str:
        """``value`` sealed for its place, as the JSON string a jsonb column holds."""
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        sealed = self.seal_bytes(run, purpose, step, text.encode(), part)
        return base64.b64encode(sealed).decode()

    def open(
        self, run: uuid.UUID | str, purpose: Purpose, step: str, stored: JSON, part: str = ""
    ) -> JSON:
        """The value ``stored`` holds, read at its place; :class:`Unopenable` otherwise."""
        try:
            sealed = base64.b64decode(stored, validate=True) if isinstance(stored, str) else b""
        except binascii.Error:
            sealed = b""
        value: JSON = json.loads(self.open_bytes(run, purpose, step, sealed, part))
        return value

    def seal_bytes(
        self, run: uuid.UUID | str, purpose: Purpose, step: str, data: bytes, part: str = ""
    ) -> bytes:
        """``data`` sealed for its place, as a bytea column holds it."""
        return seal(self.key, Place(self.installation, _id(run), purpose, step, part), data)

    def open_bytes(
        self, run: uuid.UUID | str, purpose: Purpose, step: str, stored: bytes, part: str = ""
    ) -> bytes:
        """The bytes ``stored`` holds, read at its place; :class:`Unopenable` otherwise."""
        place = Place(self.installation, _id(run), purpose, step, part)
        if not stored:
            raise Unopenable(CustodyCode.MALFORMED, f"{place} is not a sealed value")
        return open_sealed(self.keys, place, stored)

    def digest(self, data: bytes) -> str:
        """A digest of ``data`` that only a holder of the installation's shared key can
        make, ``hmac-sha256:<hex>``: a dump cannot confirm a guessed value by hashing it."""
        return "hmac-sha256:" + hmac.new(self._digest_key, data, hashlib.sha256).hexdigest()

    @cached_property
    def _digest_key(self) -> bytes:
        """A key of its own for digests, derived from the shared key: never one key for
        two purposes."""
        return hmac.new((self.shared or self.key).secret, _DIGEST_LABEL, hashlib.sha256).digest()

    @cached_property
    def _subject_key(self) -> bytes:
        return hmac.new((self.shared or self.key).secret, _SUBJECT_LABEL, hashlib.sha256).digest()

    def seal_sending(
        self, run: uuid.UUID | str, step: str, column: str, value: JSON | bytes
    ) -> JSON | bytes:
        """A sending's ``column`` (:data:`SENDING`) as its execution row holds it."""
        purpose, part, raw = SENDING[column]
        if isinstance(value, bytes):
            assert raw, f"{column} holds JSON"
            return self.seal_bytes(run, purpose, step, value, part)
        assert not raw, f"{column} holds bytes"
        return self.seal(run, purpose, step, value, part)

    def open_sending(
        self, run: uuid.UUID | str, step: str, column: str, stored: JSON | bytes
    ) -> JSON | bytes:
        """What a sending's ``column`` holds sealed, opened (:meth:`seal_sending`)."""
        purpose, part, raw = SENDING[column]
        if isinstance(stored, bytes | memoryview):
            assert raw, f"{column} holds JSON"
            return self.open_bytes(run, purpose, step, bytes(stored), part)
        assert not raw, f"{column} holds bytes"
        return self.open(run, purpose, step, stored, part)

    def seal_detail(self, run: uuid.UUID | str, step: str, detail: JSON) -> JSON:
        """A history event's ``detail`` as a sealed run's history holds it
        (:data:`EVENT_FIELDS` sealed). The chain hashes the ciphertext, which outlives an
        erased key."""
        return _fields(detail, partial(self.seal_field, run, step))

    def open_detail(
        self, run: uuid.UUID | str, step: str, detail: JSON, data_key: int | None = None
    ) -> JSON:
        """A sealed run's history event ``detail`` as it was written (:meth:`seal_detail`);
        its sealed fields null if they were sealed under ``data_key``, since erased."""
        if data_key is not None and self.erased(data_key):
            return _fields(detail, lambda name, stored: None)
        return _fields(detail, partial(self.open_field, run, step))

    def seal_field(self, run: uuid.UUID | str, step: str, name: str, value: JSON) -> str:
        """An event's field ``name`` (:data:`EVENT_FIELDS`) as its sealed detail holds it:
        sealed as part ``event.<name>``, never a sending's column (its ``url``), so that
        one cannot stand in for the other."""
        return self.seal(run, EVENT_FIELDS[name], step, value, f"event.{name}")

    def open_field(self, run: uuid.UUID | str, step: str, name: str, stored: JSON) -> JSON:
        return self.open(run, EVENT_FIELDS[name], step, stored, f"event.{name}")


#: A sending's columns (``executions``) that hold what a product was sent and answered:
#: each one's purpose and part, and whether it holds bytes (bytea) rather than JSON.
SENDING: dict[str, tuple[Purpose, str, bool]] = {
    "url": (Purpose.REQUEST, "url", False),  # a path may hold a national id
    "headers": (Purpose.REQUEST, "headers", False),
    "body": (Purpose.REQUEST, "body", True),
    "response": (Purpose.ANSWER, "response", True),
    "late_response": (Purpose.ANSWER, "late", True),
}
#: The fields of a history event's detail that can hold personal data, and their purpose:
#: sealed in a sealed run's events, each for its event's step and field (part ``event.url``).
#: The rest of a detail (attempts, statuses, codes, keys, instants) stays in clear.
EVENT_FIELDS: dict[str, Purpose] = {
    "url": Purpose.REQUEST,
    "binding": Purpose.REQUEST,  # the addresses a resend was sealed to and went to
    "receiptLookup": Purpose.REQUEST,  # reconcile's lookup: its URL may hold the query's
    "reason": Purpose.REASON,
    "attestation": Purpose.REASON,
    "why": Purpose.ANSWER,  # why reconcile found no confirmation: a product's words
}


def _fields(detail: JSON, change: Callable[[str, JSON], JSON]) -> JSON:
    if not isinstance(detail, dict) or EVENT_FIELDS.keys().isdisjoint(detail):
        return detail
    return {k: change(k, v) if k in EVENT_FIELDS else v for k, v in detail.items()}


def sealer_for(sealer: Sealer | None, run: object) -> Sealer:
    """``sealer``, for ``run`` whose data is sealed (to seal more of it, take the run's
    own: :meth:`Sealer.under` its ``data_key``); refused where there is none (a start
    refuses such a database first: this holds a store used without its custody)."""
    if sealer is None:
        raise Unopenable(
            CustodyCode.KEK_MISSING,
            f"run {run}'s data is sealed, and the configuration has no custody keys: "
            "give custody: {keys: ..., active: N} as it was",
        )
    return sealer


def _id(run: uuid.UUID | str) -> uuid.UUID:
    return run if isinstance(run, uuid.UUID) else uuid.UUID(run)
