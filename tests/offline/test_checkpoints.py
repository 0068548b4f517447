"""semantics/checkpoints without the database: the RFC 6962 tree a checkpoint signs, the
inclusion proofs that tie a run's head to it, the signed statement, and the keys it is
signed with. The tree is held to an independent reference written here from the RFC and
to Certificate Transparency's published vectors, so a change in the module cannot carry
its own expectations with it."""

from __future__ import annotations

import base64
import datetime
import hashlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from registry_coordinator.semantics import checkpoints
from registry_coordinator.semantics.chain import canonical, parse
from registry_coordinator.semantics.checkpoints import (
    Checkpoint,
    Leaf,
    UnusableKey,
    inclusion,
    key_id,
    proven_root,
    public_pem,
    root,
    sign,
    signed_by,
)

# Fixed seeds, so a failing example replays with the same signatures.
KEY = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"test_checkpoints: signer").digest())
OTHER = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"test_checkpoints: other").digest())

HASHES = st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=70)
# Distinct leaves: with two equal leaves, either index proves the same root, rightly.
DISTINCT = st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=70, unique=True)
ENTRIES = st.lists(st.binary(max_size=40), min_size=1, max_size=70)
HEX32 = st.binary(min_size=32, max_size=32).map(bytes.hex)
INSTANTS = st.datetimes(timezones=st.just(datetime.UTC)).map(
    lambda t: t.isoformat().replace("+00:00", "Z")
)
LEAVES = st.lists(
    st.builds(
        Leaf,
        st.uuids().map(str),
        st.integers(1, 2**40),
        st.binary(min_size=32, max_size=32),
    ),
    min_size=1,
    max_size=9,
)


def mth(entries: Sequence[bytes]) -> bytes:
    """RFC 6962 section 2.1's Merkle Tree Hash over raw entries, as the RFC writes it."""
    n = len(entries)
    if n == 1:
        return hashlib.sha256(b"\x00" + entries[0]).digest()
    k = 1 << ((n - 1).bit_length() - 1)  # the largest power of two smaller than n
    return hashlib.sha256(b"\x01" + mth(entries[:k]) + mth(entries[k:])).digest()


def audit_path(m: int, entries: Sequence[bytes]) -> list[bytes]:
    """RFC 6962 section 2.1.1's PATH(m, D[n])."""
    n = len(entries)
    if n == 1:
        return []
    k = 1 << ((n - 1).bit_length() - 1)
    if m < k:
        return [*audit_path(m, entries[:k]), mth(entries[k:])]
    return [*audit_path(m - k, entries[k:]), mth(entries[:k])]


def leaf_hashes(entries: Sequence[bytes]) -> list[bytes]:
    return [hashlib.sha256(b"\x00" + e).digest() for e in entries]


def flipped(value: bytes, position: int, mask: int) -> bytes:
    """``value`` with the byte at ``position`` XORed with ``mask`` (never 0)."""
    out = bytearray(value)
    out[position % len(out)] ^= mask
    return bytes(out)


MASKS = st.integers(1, 255)


@given(HASHES)
def test_every_leaf_s_inclusion_proof_leads_to_the_root(hashes: list[bytes]) -> None:
    expected = root(hashes)
    for index, leaf in enumerate(hashes):
        assert proven_root(leaf, index, len(hashes), inclusion(hashes, index)) == expected


@given(ENTRIES)
def test_root_and_paths_are_rfc_6962_s(entries: list[bytes]) -> None:
    hashes = leaf_hashes(entries)
    assert root(hashes) == mth(entries)
    for index in range(len(entries)):
        assert inclusion(hashes, index) == audit_path(index, entries)


# Certificate Transparency's test vectors (google/certificate-transparency, the merkle
# tests): the entries, the tree hash of each prefix, and some inclusion paths.
CT_ENTRIES = [
    bytes.fromhex(h)
    for h in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
CT_PATHS = [  # (index, size, path)
    (0, 1, []),
    (
        0,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        5,
        8,
        [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (
        1,
        5,
        [
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
]


def test_the_tree_matches_certificate_transparency_s_vectors() -> None:
    hashes = leaf_hashes(CT_ENTRIES)
    assert [root(hashes[:n]).hex() for n in range(1, 9)] == CT_ROOTS
    for index, size, path in CT_PATHS:
        assert [p.hex() for p in inclusion(hashes[:size], index)] == path
        proven = proven_root(hashes[index], index, size, [bytes.fromhex(p) for p in path])
        assert proven is not None
        assert proven.hex() == CT_ROOTS[size - 1]


def test_small_trees_by_hand() -> None:
    """n = 1, 2, 3 spelled out: a lone leaf is the root; three leaves split 2 + 1."""
    a, b, c = leaf_hashes([b"a", b"b", b"c"])

    def node(left: bytes, right: bytes) -> bytes:
        return hashlib.sha256(b"\x01" + left + right).digest()

    assert root([a]) == a
    assert root([a, b]) == node(a, b)
    assert root([a, b, c]) == node(node(a, b), c)
    assert inclusion([a, b, c], 2) == [node(a, b)]
    assert inclusion([a, b, c], 0) == [b, c]
    with pytest.raises(ValueError, match="at least one leaf"):
        root([])
    with pytest.raises(IndexError):
        inclusion([a, b, c], 3)


@given(DISTINCT, st.data())
def test_a_proof_that_was_changed_does_not_lead_to_the_root(
    hashes: list[bytes], data: st.DataObject
) -> None:
    size = len(hashes)
    index = data.draw(st.integers(0, size - 1), label="index")
    leaf, path, expected = hashes[index], inclusion(hashes, index), root(hashes)

    other_leaf = data.draw(st.binary(min_size=32, max_size=32).filter(lambda h: h != leaf))
    assert proven_root(other_leaf, index, size, path) != expected

    if path:
        at = data.draw(st.integers(0, len(path) - 1), label="sibling")
        byte, mask = data.draw(st.integers(0, 31)), data.draw(MASKS)
        changed = [*path[:at], flipped(path[at], byte, mask), *path[at + 1 :]]
        assert proven_root(leaf, index, size, changed) != expected

    wrong = data.draw(st.integers(0, size + 3).filter(lambda i: i != index), label="wrong")
    assert proven_root(leaf, wrong, size, path) != expected

    # A path whose length is not the tree's is no proof at all, whatever it holds.
    if path:
        dropped = data.draw(st.integers(0, len(path) - 1), label="dropped")
        assert proven_root(leaf, index, size, [*path[:dropped], *path[dropped + 1 :]]) is None
    extra = data.draw(st.binary(min_size=32, max_size=32), label="extra")
    at = data.draw(st.integers(0, len(path)), label="inserted at")
    assert proven_root(leaf, index, size, [*path[:at], extra, *path[at:]]) is None


@given(st.text(), st.integers(0, 2**63), st.binary(min_size=32, max_size=32))
def test_a_leaf_is_hashed_as_a_leaf_and_never_as_a_node(run: str, seq: int, head: bytes) -> None:
    text = canonical({"head": head.hex(), "run": run, "seq": seq}).encode("utf-8")
    hashed = Leaf(run, seq, head).hash()
    assert hashed == hashlib.sha256(b"\x00" + text).digest()
    # The same bytes hashed as a node (0x01) give another hash: no leaf passes for a node.
    assert hashed != hashlib.sha256(b"\x01" + text).digest()
    assert hashed != hashlib.sha256(text).digest()
    assert root([hashed]) == hashed


@given(
    st.uuids().map(str),
    st.integers(1, 2**40),
    st.binary(min_size=32, max_size=32),
    st.sampled_from(["run", "seq", "head"]),
    st.data(),
)
def test_a_leaf_s_hash_covers_its_run_seq_and_head(
    run: str, seq: int, head: bytes, field: str, data: st.DataObject
) -> None:
    leaf = Leaf(run, seq, head)
    changes: dict[str, Any] = {
        "run": st.uuids().map(str).filter(lambda r: r != run),
        "seq": st.integers(0, 2**40).filter(lambda s: s != seq),
        "head": st.binary(min_size=32, max_size=32).filter(lambda h: h != head),
    }
    changed = replace(leaf, **{field: data.draw(changes[field], label=field)})
    assert changed.hash() != leaf.hash()


CHECKPOINTS = st.builds(
    lambda number, at, previous, leaves: sign(KEY, number, at, previous, leaves),
    st.integers(0, 10**9),
    INSTANTS,
    st.none() | HEX32,
    LEAVES,
)


def changed_field(checkpoint: Checkpoint, field: str, data: st.DataObject) -> Checkpoint:
    """``checkpoint`` with ``field`` changed to another value the format allows."""
    current = getattr(checkpoint, field)
    if field == "signature":
        byte, mask = data.draw(st.integers(0, 63)), data.draw(MASKS)
        return replace(checkpoint, signature=flipped(current, byte, mask))
    values: dict[str, st.SearchStrategy[Any]] = {
        "number": st.integers(0, 10**9),
        "at": INSTANTS | st.text(),
        "previous": st.none() | HEX32,
        "root": st.binary(min_size=32, max_size=32),
        "leaves": st.integers(0, 100),
        "key": st.just(key_id(OTHER.public_key())) | HEX32,
    }
    value = data.draw(values[field].filter(lambda v: v != current), label=field)
    return replace(checkpoint, **{field: value})


STATEMENT = ["number", "at", "previous", "root", "leaves", "key"]


@given(CHECKPOINTS)
def test_a_checkpoint_is_signed_by_its_key_over_its_leaves(checkpoint: Checkpoint) -> None:
    assert signed_by(checkpoint, KEY.public_key()) is None
    assert checkpoint.key == key_id(KEY.public_key())
    assert len(checkpoint.signature) == 64
    assert checkpoint.digest() == hashlib.sha256(checkpoint.statement()).hexdigest()


@given(LEAVES, st.integers(0, 10**9), INSTANTS, st.none() | HEX32)
def test_a_checkpoint_s_root_is_the_tree_over_its_leaves_in_order(
    leaves: list[Leaf], number: int, at: str, previous: str | None
) -> None:
    checkpoint = sign(KEY, number, at, previous, leaves)
    assert checkpoint.root == root([leaf.hash() for leaf in leaves])
    assert checkpoint.leaves == len(leaves)
    assert (checkpoint.number, checkpoint.at, checkpoint.previous) == (number, at, previous)


@given(CHECKPOINTS, st.sampled_from([*STATEMENT, "signature"]), st.data())
def test_any_change_to_a_checkpoint_breaks_its_signature(
    checkpoint: Checkpoint, field: str, data: st.DataObject
) -> None:
    why = signed_by(changed_field(checkpoint, field, data), KEY.public_key())
    assert isinstance(why, str)
    assert why
    assert "\n" not in why


@given(CHECKPOINTS)
def test_another_key_is_named_as_not_the_signer(checkpoint: Checkpoint) -> None:
    why = signed_by(checkpoint, OTHER.public_key())
    assert why is not None
    assert checkpoint.key[:16] in why
    assert key_id(OTHER.public_key())[:16] in why


@given(LEAVES)
def test_a_checkpoint_that_claims_a_key_it_was_not_signed_with_does_not_hold(
    leaves: list[Leaf],
) -> None:
    forged = replace(
        sign(OTHER, 1, "2026-12-01T00:00:00Z", None, leaves), key=key_id(KEY.public_key())
    )
    assert signed_by(forged, KEY.public_key()) == "its signature does not hold for what it says"


@given(CHECKPOINTS, st.sampled_from(STATEMENT), st.data())
def test_the_digest_covers_every_field_of_the_statement(
    checkpoint: Checkpoint, field: str, data: st.DataObject
) -> None:
    assert changed_field(checkpoint, field, data).digest() != checkpoint.digest()


@given(CHECKPOINTS, st.data())
def test_the_digest_is_of_the_statement_not_the_signature(
    checkpoint: Checkpoint, data: st.DataObject
) -> None:
    """A checkpoint's successor names its digest, which is of what was signed: the
    signature is checked by signed_by, not by the chain of digests."""
    assert changed_field(checkpoint, "signature", data).digest() == checkpoint.digest()


@given(CHECKPOINTS)
def test_the_statement_is_canonical_json_naming_the_format(checkpoint: Checkpoint) -> None:
    statement = checkpoint.statement()
    assert canonical(parse(statement)).encode("utf-8") == statement
    assert parse(statement) == {
        "at": checkpoint.at,
        "format": checkpoints.FORMAT,
        "key": checkpoint.key,
        "leaves": checkpoint.leaves,
        "number": checkpoint.number,
        "previous": checkpoint.previous,
        "root": checkpoint.root.hex(),
    }
    assert b"signature" not in statement


def test_the_keys_load_from_the_pem_openssl_writes() -> None:
    pem = KEY.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")
    loaded = checkpoints.signing_key(pem)
    assert key_id(loaded.public_key()) == key_id(KEY.public_key())
    public = checkpoints.public_key(public_pem(KEY.public_key()).encode("ascii"))
    assert key_id(public) == key_id(KEY.public_key())
    assert len(key_id(public)) == 64


# An EC key on a curve the cryptography library does not support (openssl genpkey
# -algorithm EC -pkeyopt ec_paramgen_curve:secp112r1, and its pkey -pubout).
SECP112R1_PRIVATE = """\
-----BEGIN PRIVATE KEY-----
ME4CAQAwEAYHKoZIzj0CAQYFK4EEAAYENzA1AgEBBA5DrwOJN+UJvjKzDvOUO6Eg
Ax4ABILHSrKmhH03InwWiJulCgSrIVeH0q3kd7KRpHo=
-----END PRIVATE KEY-----
"""
SECP112R1_PUBLIC = """\
-----BEGIN PUBLIC KEY-----
MDIwEAYHKoZIzj0CAQYFK4EEAAYDHgAEgsdKsqaEfTcifBaIm6UKBKshV4fSreR3
spGkeg==
-----END PUBLIC KEY-----
"""


@pytest.fixture(scope="module")
def unusable() -> dict[str, tuple[str, str]]:
    """(private PEM, public PEM) of keys a checkpoint cannot be signed or checked with.
    Made once, not at import: an RSA key takes a while."""
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    pems: dict[str, tuple[str, str]] = {}
    for name, key in (("RSA", rsa_key), ("EC", ec_key)):
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode("ascii")
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        pems[name] = (private, public.decode("ascii"))
    encrypted = KEY.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"a passphrase"),
    ).decode("ascii")
    pems["encrypted"] = (encrypted, encrypted)
    pems["garbage"] = ("not a key at all", "not a key at all")
    pems["empty"] = ("", "")
    pems["bad base64"] = (
        "-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n",
        "-----BEGIN PUBLIC KEY-----\n!!!!\n-----END PUBLIC KEY-----\n",
    )
    pems["the other half"] = (public_pem(KEY.public_key()), encrypted)
    pems["unsupported curve"] = (SECP112R1_PRIVATE, SECP112R1_PUBLIC)
    return pems


def assert_unusable(load: Any, pem: Any) -> str:
    """The message ``load`` refuses ``pem`` with: a line saying why."""
    with pytest.raises(UnusableKey) as refused:
        load(pem)
    message = str(refused.value)
    assert message.startswith("it is ")
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "name",
    [
        "RSA",
        "EC",
        "encrypted",
        "garbage",
        "empty",
        "bad base64",
        "the other half",
        "unsupported curve",
    ],
)
def test_keys_other_than_an_unencrypted_ed25519_pem_are_refused_with_why(
    unusable: dict[str, tuple[str, str]], name: str
) -> None:
    private, public = unusable[name]
    private_why = assert_unusable(checkpoints.signing_key, private)
    public_why = assert_unusable(checkpoints.public_key, public.encode("utf-8"))
    if name in ("RSA", "EC"):
        assert private_why == f"it is a {name}PrivateKey, not an Ed25519 key"
        assert public_why == f"it is a {name}PublicKey, not an Ed25519 key"
    if name == "encrypted":
        assert "encrypted" in private_why


@given(st.text())
def test_any_text_that_is_not_a_key_is_refused(text: str) -> None:
    assert_unusable(checkpoints.signing_key, text)
    assert_unusable(checkpoints.public_key, text.encode("utf-8"))


@given(st.binary(max_size=200), st.sampled_from(["PRIVATE KEY", "PUBLIC KEY"]))
def test_a_pem_around_any_bytes_is_refused(der: bytes, label: str) -> None:
    pem = (
        f"-----BEGIN {label}-----\n"
        + base64.encodebytes(der).decode("ascii")
        + f"-----END {label}-----\n"
    )
    assert_unusable(checkpoints.signing_key, pem)
    assert_unusable(checkpoints.public_key, pem.encode("ascii"))
