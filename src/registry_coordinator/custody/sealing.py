"""Sealed values and wrapped data keys: AES-256-GCM with the place a value belongs to as
its associated data.

A sealed value is ``format (1 byte) | data key id (8) | nonce (12) | ciphertext and tag``.
Its associated data names the installation (the database's own id, kept by backups and
restores), the run, the purpose, the step and the part of it (which column of a sending,
which field of a history event; none for a run's own values), each length-prefixed after
a fixed label, and the data key's id: a value copied into another row, column, field, run
or database, or
sealed under another key than the one it names, does not open. AEAD cannot tell a value
moved from a value changed, so both are one refusal, :attr:`CustodyCode.NOT_AUTHENTIC`,
which names the place it was read at — never a silent wrong value.

A data key is wrapped the same way under a key-encryption key (KEK), the associated data
naming the installation, the data key's id and the KEK's version, so a wrapped key moved
to another row or database does not unwrap either. Nonces are 96 random bits per value:
under one key, far fewer values are sealed than the 2**32 that bound keeps safe.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from registry_coordinator.errors import CoordinatorError

FORMAT = 1
KEY_BYTES = 32
NONCE_BYTES = 12
_ID_BYTES = 8
_HEADER = 1 + _ID_BYTES
_TAG_BYTES = 16
_SEALED_LABEL = b"registry-coordinator/sealed/1"
_WRAPPED_LABEL = b"registry-coordinator/data-key/1"


class Purpose(StrEnum):
    """What a sealed value is, as its associated data names it."""

    INPUT = "input"
    OUTPUT = "output"  # a step's output, or the run's with step ""
    REQUEST = "request"  # a sealed request: its URL, headers and body (the part says which)
    ANSWER = "answer"  # a product's answer (part ``response``), or a late one (``late``)
    RESULT = "result"  # a result read or delivered
    PAYLOAD = "payload"  # a webhook's payload
    REASON = "reason"  # an operator's reason or attestation


#: The run a value that belongs to no run is sealed for (a webhook's payload).
NO_RUN = uuid.UUID(int=0)


class CustodyCode(StrEnum):
    """Why a sealed value or a wrapped key does not open: a closed list."""

    #: Sealed for another place (row, column, run, purpose, step or database), or
    #: changed since it was sealed; AEAD cannot tell the two apart.
    NOT_AUTHENTIC = "custody.not-authentic"
    #: Not a sealed value of a format this build reads.
    MALFORMED = "custody.malformed"
    #: It names a data key the store does not hold.
    UNKNOWN_KEY = "custody.unknown-key"
    #: Its data key was erased: the value is gone for good.
    ERASED = "custody.erased"
    #: Its data key is wrapped under a KEK version the configuration does not list.
    KEK_MISSING = "custody.kek-missing"


class Unopenable(CoordinatorError):
    """A sealed value or wrapped key that does not open, with its code and where."""

    summary = "sealed data does not open"

    def __init__(self, code: CustodyCode, message: str) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Place:
    """Where a sealed value belongs: what its associated data binds it to."""

    installation: uuid.UUID
    run: uuid.UUID
    purpose: Purpose
    step: str = ""
    #: Which part of the step's ``purpose`` (``url``, ``body``, ``event.reason``, …);
    #: none for a run's input, outputs and output. Only a part that is named is in the
    #: associated data, so that values sealed before parts existed open as they were.
    part: str = ""

    def associated(self, key: int) -> bytes:
        parts = [
            self.installation.bytes,
            self.run.bytes,
            self.purpose.value.encode(),
            self.step.encode(),
            *([self.part.encode()] if self.part else []),
            key.to_bytes(_ID_BYTES, "big"),
        ]
        return _SEALED_LABEL + b"".join(len(p).to_bytes(4, "big") + p for p in parts)

    def __str__(self) -> str:
        step = f" at step {self.step}" if self.step else ""
        part = f" ({self.part})" if self.part else ""
        return f"the {self.purpose}{part} of run {self.run}{step}"


@dataclass(frozen=True)
class DataKey:
    """A data key, unwrapped: its id in the store and its 32 bytes."""

    id: int
    secret: bytes

    def __post_init__(self) -> None:
        if len(self.secret) != KEY_BYTES or not 0 < self.id < 2 ** (8 * _ID_BYTES):
            raise ValueError("a data key is 32 bytes with an id of 1 to 2**64 - 1")

    def __repr__(self) -> str:  # never the secret, in a traceback or a log
        return f"DataKey(id={self.id})"


@dataclass(frozen=True)
class Kek:
    """A key-encryption key of the configuration: its version and its 32 bytes."""

    version: int
    secret: bytes

    def __post_init__(self) -> None:
        if len(self.secret) != KEY_BYTES or self.version < 1:
            raise ValueError("a key-encryption key is 32 bytes with a version from 1")

    def __repr__(self) -> str:
        return f"Kek(version={self.version})"


def new_kek() -> str:
    """A new key-encryption key as ``custody.keys`` reads one: 64 hexadecimal digits."""
    return os.urandom(KEY_BYTES).hex()


def seal(key: DataKey, place: Place, plaintext: bytes) -> bytes:
    """``plaintext`` sealed under ``key`` for ``place``."""
    nonce = os.urandom(NONCE_BYTES)
    sealed = AESGCM(key.secret).encrypt(nonce, plaintext, place.associated(key.id))
    return bytes([FORMAT]) + key.id.to_bytes(_ID_BYTES, "big") + nonce + sealed


def key_of(sealed: bytes) -> int:
    """The id of the data key a sealed value names; :class:`Unopenable` if it is none."""
    if len(sealed) < _HEADER + NONCE_BYTES + _TAG_BYTES or sealed[0] != FORMAT:
        raise Unopenable(CustodyCode.MALFORMED, "this is not a sealed value this build reads")
    return int.from_bytes(sealed[1:_HEADER], "big")


def open_sealed(keys: Mapping[int, DataKey | None], place: Place, sealed: bytes) -> bytes:
    """The plaintext of ``sealed`` read at ``place``, its key found in ``keys`` (None for
    a key that was erased); :class:`Unopenable` naming the place if it does not open."""
    try:
        id_ = key_of(sealed)
    except Unopenable as exc:
        raise Unopenable(exc.code, f"{place} is not a sealed value this build reads") from None
    if id_ not in keys:
        raise Unopenable(CustodyCode.UNKNOWN_KEY, f"{place} names data key {id_}, not held")
    key = keys[id_]
    if key is None:
        raise Unopenable(CustodyCode.ERASED, f"{place} was under data key {id_}, erased")
    nonce, body = sealed[_HEADER : _HEADER + NONCE_BYTES], sealed[_HEADER + NONCE_BYTES :]
    try:
        return AESGCM(key.secret).decrypt(nonce, body, place.associated(id_))
    except InvalidTag:
        raise Unopenable(
            CustodyCode.NOT_AUTHENTIC,
            f"{place} does not open here: it was sealed for another row, column, run or "
            "database, or changed since",
        ) from None


def _wrapping(installation: uuid.UUID, key: int, version: int) -> bytes:
    parts = [installation.bytes, key.to_bytes(_ID_BYTES, "big"), version.to_bytes(4, "big")]
    return _WRAPPED_LABEL + b"".join(parts)


def wrap(kek: Kek, installation: uuid.UUID, key: DataKey) -> bytes:
    """``key`` wrapped under ``kek`` for the store of ``installation``."""
    nonce = os.urandom(NONCE_BYTES)
    ad = _wrapping(installation, key.id, kek.version)
    return nonce + AESGCM(kek.secret).encrypt(nonce, key.secret, ad)


def unwrap(
    keks: Mapping[int, Kek], installation: uuid.UUID, key: int, version: int, wrapped: bytes
) -> DataKey:
    """Data key ``key`` of ``installation``, wrapped under KEK ``version``."""
    kek = keks.get(version)
    if kek is None:
        listed = ", ".join(str(v) for v in sorted(keks)) or "none"
        raise Unopenable(
            CustodyCode.KEK_MISSING,
            f"data key {key} is wrapped under key-encryption key {version}, and custody.keys "
            f"lists {listed}: list it again (a rotation keeps a version until no key names it)",
        )
    try:
        secret = AESGCM(kek.secret).decrypt(
            wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], _wrapping(installation, key, version)
        )
    except InvalidTag:
        raise Unopenable(
            CustodyCode.NOT_AUTHENTIC,
            f"data key {key} does not unwrap under key-encryption key {version}: the key "
            "configured for that version is another, or the row was moved or changed",
        ) from None
    return DataKey(key, secret)
