"""The ``audit`` and ``retention`` sections, read by ``audit/``: the Ed25519 key run heads
are signed into checkpoints with, by reference, and when ended runs leave the hot tables
for verified bundles (which needs that key: a bundle is proven by a signed checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.fields import Reader
from registry_coordinator.authoring.source import DataPath
from registry_coordinator.config.values import (
    read_duration,
    read_integer,
    read_secret,
)
from registry_coordinator.semantics.checkpoints import UnusableKey, signing_key


@dataclass(frozen=True)
class AuditConfig:
    """How run heads are signed into checkpoints (none are made without a key)."""

    signing_key: Ed25519PrivateKey | None = field(repr=False)
    checkpoint_every: timedelta


@dataclass(frozen=True)
class RetentionConfig:
    """When ended runs leave the hot tables for verified bundles in ``directory``."""

    archive_after: timedelta | None  # None: ended runs stay
    directory: Path | None
    batch: int  # runs per transaction
    every: timedelta  # between passes, while nothing is due


def read_audit(reader: Reader, value: JSON) -> AuditConfig:
    """The key checkpoints are signed with, by reference, and how often they are made."""
    path: DataPath = ("audit",)
    data = reader.mapping(value, path, "audit") or {}
    reader.fields(data, path, "audit", [], ["signingKey", "checkpointEvery"])
    every = read_duration(
        reader, data, "checkpointEvery", path, timedelta(minutes=1), timedelta(seconds=1)
    )
    pem = read_secret(reader, data, "signingKey", path, "audit")
    if pem is None:
        return AuditConfig(None, every)
    try:
        return AuditConfig(signing_key(pem), every)
    except UnusableKey as exc:
        reader.report(
            "config.invalid-value",
            f"audit signingKey cannot sign checkpoints: {exc}",
            "make one with: openssl genpkey -algorithm ed25519 -out audit-key.pem",
            (*path, "signingKey"),
        )
        return AuditConfig(None, every)


def read_retention(reader: Reader, value: JSON, base: Path, audit: AuditConfig) -> RetentionConfig:
    """How long ended runs stay in the hot tables, and where their bundles go."""
    path: DataPath = ("retention",)
    data = reader.mapping(value, path, "retention") or {}
    required = ["archiveAfter", "directory"] if data else []
    reader.fields(data, path, "retention", required, ["batch", "every"])
    after = reader.duration(data, "archiveAfter", path, "retention")
    directory = reader.string(data, "directory", path, "retention")
    batch = read_integer(reader, data, "batch", path, 20, 1, 1000)
    every = read_duration(reader, data, "every", path, timedelta(minutes=5), timedelta(seconds=1))
    if after is not None and audit.signing_key is None:
        reader.report(
            "config.invalid-value",
            "retention archives runs to bundles proven by a signed checkpoint, and audit has "
            "no signingKey",
            "give audit: {signingKey: file:/path/to/audit-key.pem}",
            (*path, "archiveAfter"),
        )
    return RetentionConfig(after, (base / directory).resolve() if directory else None, batch, every)
