"""Signed checkpoints over run heads, computed and checked without the database.

A hash chain shows that a history was not changed since its head was known, but an
administrator who rewrites a history can recompute every hash after the change. So
the service periodically records a **checkpoint**: a Merkle tree over the heads
(run, seq, hash of event seq) of the runs that changed since the previous checkpoint,
and a statement naming the tree's root, the previous checkpoint's digest and the
signing key, signed with Ed25519. Whoever holds the public key can then check a
history against the checkpoint without trusting the database: a rewritten history
no longer has the head the checkpoint signed, and a rewritten checkpoint no longer
carries a signature the key made. A copy of a checkpoint kept elsewhere catches even
checkpoints that were removed, because each names the digest of the one before.

The tree is RFC 6962's (Certificate Transparency): a leaf is hashed with a 0x00 prefix
and a node with 0x01, so no leaf can pass for a node; a tree of n leaves splits at the
largest power of two below n. An inclusion proof is the list of sibling hashes from
the leaf up. Every text here is the chain's canonical JSON, so the bytes are the same
whoever writes them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from registry_coordinator.semantics.chain import canonical

FORMAT = "registry-coordinator.checkpoint/v1"


@dataclass(frozen=True)
class Leaf:
    """A run's head as a checkpoint records it: its event ``seq`` had hash ``head``."""

    run: str
    seq: int
    head: bytes

    def hash(self) -> bytes:
        text = canonical({"head": self.head.hex(), "run": self.run, "seq": self.seq})
        return hashlib.sha256(b"\x00" + text.encode("utf-8")).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def root(leaves: Sequence[bytes]) -> bytes:
    """The Merkle tree hash of leaf hashes ``leaves`` (at least one)."""
    if not leaves:
        raise ValueError("a checkpoint's tree has at least one leaf")
    if len(leaves) == 1:
        return leaves[0]
    k = _split(len(leaves))
    return _node(root(leaves[:k]), root(leaves[k:]))


def inclusion(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """The sibling hashes that lead from leaf ``index`` to the root, lowest first."""
    if not 0 <= index < len(leaves):
        raise IndexError(f"no leaf {index} among {len(leaves)}")
    if len(leaves) == 1:
        return []
    k = _split(len(leaves))
    if index < k:
        return [*inclusion(leaves[:k], index), root(leaves[k:])]
    return [*inclusion(leaves[k:], index - k), root(leaves[:k])]


def proven_root(leaf: bytes, index: int, size: int, path: Sequence[bytes]) -> bytes | None:
    """The root that ``path`` leads to from ``leaf``, at ``index`` of ``size`` leaves, or
    None when the path does not have the length a tree of that size gives
    (RFC 9162, section 2.1.3.2)."""
    if not 0 <= index < size:
        return None
    fn, sn, hashed = index, size - 1, leaf
    for sibling in path:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            hashed = _node(sibling, hashed)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn, sn = fn >> 1, sn >> 1
        else:
            hashed = _node(hashed, sibling)
        fn, sn = fn >> 1, sn >> 1
    return hashed if sn == 0 else None


@dataclass(frozen=True)
class Checkpoint:
    """One signed checkpoint. ``at`` is RFC 3339 text; ``previous`` the hex digest of
    checkpoint ``number - 1`` (None for the first); ``key`` the signer's raw public key
    in hex."""

    number: int
    at: str
    previous: str | None
    root: bytes
    leaves: int
    key: str
    signature: bytes

    def statement(self) -> bytes:
        """The bytes that are signed, and whose SHA-256 is this checkpoint's digest."""
        return canonical(
            {
                "at": self.at,
                "format": FORMAT,
                "key": self.key,
                "leaves": self.leaves,
                "number": self.number,
                "previous": self.previous,
                "root": self.root.hex(),
            }
        ).encode("utf-8")

    def digest(self) -> str:
        return hashlib.sha256(self.statement()).hexdigest()

    def as_json(self) -> dict[str, Any]:
        """The checkpoint as a bundle or a copy kept elsewhere holds it."""
        return {
            "at": self.at,
            "key": self.key,
            "leaves": self.leaves,
            "number": self.number,
            "previous": self.previous,
            "root": self.root.hex(),
            "signature": self.signature.hex(),
        }


class UnusableKey(ValueError):
    """A signing or public key that cannot be used, with why."""


def _loaded(load: Callable[[], object], kind: type, what: str) -> object:
    """The key ``load`` reads, which must be of ``kind``; UnusableKey saying why not."""
    try:
        key = load()
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise UnusableKey(f"it is not {what} ({exc})") from None
    if not isinstance(key, kind):
        raise UnusableKey(f"it is a {type(key).__name__.removeprefix('_')}, not an Ed25519 key")
    return key


def signing_key(pem: str) -> Ed25519PrivateKey:
    """The Ed25519 private key in PEM text (``openssl genpkey -algorithm ed25519``)."""
    key = _loaded(
        lambda: serialization.load_pem_private_key(pem.encode("utf-8"), password=None),
        Ed25519PrivateKey,
        "an unencrypted PEM private key",
    )
    assert isinstance(key, Ed25519PrivateKey)  # _loaded saw to it
    return key


def public_key(pem: bytes) -> Ed25519PublicKey:
    """The Ed25519 public key in PEM text (``openssl pkey -pubout``)."""
    key = _loaded(
        lambda: serialization.load_pem_public_key(pem), Ed25519PublicKey, "a PEM public key"
    )
    assert isinstance(key, Ed25519PublicKey)  # _loaded saw to it
    return key


def key_id(key: Ed25519PublicKey) -> str:
    """How a checkpoint names its signer: the raw 32-byte public key, in hex."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def public_pem(key: Ed25519PublicKey) -> str:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


def sign(
    key: Ed25519PrivateKey,
    number: int,
    at: str,
    previous: str | None,
    leaves: Sequence[Leaf],
) -> Checkpoint:
    """Checkpoint ``number`` over ``leaves`` (in their order), signed with ``key``."""
    unsigned = Checkpoint(
        number,
        at,
        previous,
        root([leaf.hash() for leaf in leaves]),
        len(leaves),
        key_id(key.public_key()),
        b"",
    )
    return replace(unsigned, signature=key.sign(unsigned.statement()))


def signed_by(checkpoint: Checkpoint, key: Ed25519PublicKey) -> str | None:
    """Why ``checkpoint`` was not signed by ``key``, or None when it was."""
    if checkpoint.key != key_id(key):
        return f"it names the key {checkpoint.key[:16]}…, not the one given ({key_id(key)[:16]}…)"
    try:
        key.verify(checkpoint.signature, checkpoint.statement())
    except InvalidSignature:
        return "its signature does not hold for what it says"
    return None
