"""custody.sealing without the database: a sealed value opens only at the place it was
sealed for and under the key it names; anything else is refused with its code and the
place it was read at, never read as another value. Wrapped data keys likewise."""

from __future__ import annotations

import os
import uuid
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry_coordinator.custody import (
    CustodyCode,
    DataKey,
    Kek,
    Place,
    Purpose,
    Unopenable,
    key_of,
    open_sealed,
    seal,
    unwrap,
    wrap,
)

KEYS = st.builds(DataKey, st.integers(1, 2**64 - 1), st.binary(min_size=32, max_size=32))
STEPS = st.text(max_size=20)
PLACES = st.builds(Place, st.uuids(), st.uuids(), st.sampled_from(Purpose), STEPS, STEPS)


def _refused(code: CustodyCode, call: object, *args: object) -> str:
    with pytest.raises(Unopenable) as refusal:
        call(*args)  # type: ignore[operator]
    assert refusal.value.code == code
    return str(refusal.value)


@given(KEYS, PLACES, st.binary(max_size=200))
def test_a_sealed_value_opens_where_it_was_sealed_and_holds_no_plaintext(
    key: DataKey, place: Place, plaintext: bytes
) -> None:
    sealed = seal(key, place, plaintext)
    assert key_of(sealed) == key.id
    assert open_sealed({key.id: key}, place, sealed) == plaintext
    assert seal(key, place, plaintext) != sealed  # a fresh nonce each time
    if len(plaintext) >= 8:
        assert plaintext not in sealed


@given(KEYS, PLACES, st.binary(max_size=50), st.data())
def test_a_value_read_at_any_other_place_is_refused_naming_where(
    key: DataKey, place: Place, plaintext: bytes, data: st.DataObject
) -> None:
    """Copied into another row, column or field (another run, purpose, step or part) or
    another database: each of the place's parts alone is enough to refuse it, a part named
    or left out too."""
    sealed = seal(key, place, plaintext)
    part = data.draw(st.sampled_from(["installation", "run", "purpose", "step", "part"]))
    if part == "installation":
        elsewhere = data.draw(st.uuids().filter(lambda u: u != place.installation))
        other = replace(place, installation=elsewhere)
    elif part == "run":
        other = replace(place, run=data.draw(st.uuids().filter(lambda u: u != place.run)))
    elif part == "purpose":
        purpose = data.draw(st.sampled_from([p for p in Purpose if p != place.purpose]))
        other = replace(place, purpose=purpose)
    elif part == "step":
        other = replace(place, step=place.step + data.draw(st.text(min_size=1, max_size=3)))
    else:
        other = replace(place, part=data.draw(STEPS.filter(lambda p: p != place.part)))
    message = _refused(CustodyCode.NOT_AUTHENTIC, open_sealed, {key.id: key}, other, sealed)
    assert str(other) in message and "does not open here" in message


@given(KEYS, PLACES, st.binary(max_size=50), st.data())
def test_any_changed_byte_is_refused(
    key: DataKey, place: Place, plaintext: bytes, data: st.DataObject
) -> None:
    sealed = bytearray(seal(key, place, plaintext))
    at = data.draw(st.integers(0, len(sealed) - 1), label="byte")
    sealed[at] ^= data.draw(st.integers(1, 255), label="mask")
    with pytest.raises(Unopenable) as refusal:
        open_sealed({key.id: key}, place, bytes(sealed))
    if at == 0:
        assert refusal.value.code == CustodyCode.MALFORMED
    elif at < 9:  # the key id: another key, or one not held
        assert refusal.value.code == CustodyCode.UNKNOWN_KEY
    else:
        assert refusal.value.code == CustodyCode.NOT_AUTHENTIC


def test_a_value_under_another_key_an_erased_key_or_none_is_named() -> None:
    place = Place(uuid.uuid4(), uuid.uuid4(), Purpose.INPUT)
    key, other = DataKey(1, os.urandom(32)), DataKey(1, os.urandom(32))
    sealed = seal(key, place, b'{"email": "a@example.org"}')
    _refused(CustodyCode.NOT_AUTHENTIC, open_sealed, {1: other}, place, sealed)
    message = _refused(CustodyCode.UNKNOWN_KEY, open_sealed, {}, place, sealed)
    assert (
        message == f"the input of run {place.run} names data key 1, not held (custody.unknown-key)"
    )
    message = _refused(CustodyCode.ERASED, open_sealed, {1: None}, place, sealed)
    assert message == f"the input of run {place.run} was under data key 1, erased (custody.erased)"
    for short in (b"", b"\x01" + bytes(20), b"\x02" + sealed[1:]):
        _refused(CustodyCode.MALFORMED, open_sealed, {1: key}, place, short)
    assert "secret" not in repr(key) and key.secret.hex() not in repr(key)


@given(KEYS, st.uuids(), st.integers(1, 2**31))
def test_a_wrapped_key_unwraps_only_in_its_row_of_its_installation(
    key: DataKey, installation: uuid.UUID, version: int
) -> None:
    kek = Kek(version, os.urandom(32))
    wrapped = wrap(kek, installation, key)
    assert key.secret not in wrapped
    assert unwrap({version: kek}, installation, key.id, version, wrapped) == key
    moved = key.id % (2**64 - 1) + 1
    _refused(
        CustodyCode.NOT_AUTHENTIC, unwrap, {version: kek}, installation, moved, version, wrapped
    )
    elsewhere = uuid.UUID(int=installation.int ^ 1)
    _refused(CustodyCode.NOT_AUTHENTIC, unwrap, {version: kek}, elsewhere, key.id, version, wrapped)
    replaced = Kek(version, os.urandom(32))
    _refused(
        CustodyCode.NOT_AUTHENTIC,
        unwrap,
        {version: replaced},
        installation,
        key.id,
        version,
        wrapped,
    )
    missing = _refused(CustodyCode.KEK_MISSING, unwrap, {}, installation, key.id, version, wrapped)
    assert f"key-encryption key {version}, and custody.keys lists none" in missing


def test_keys_of_the_wrong_size_are_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        DataKey(1, b"short")
    with pytest.raises(ValueError, match="32 bytes"):
        DataKey(0, bytes(32))
    with pytest.raises(ValueError, match="32 bytes"):
        Kek(0, bytes(32))
