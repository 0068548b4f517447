"""The ``workflows`` and ``engine`` sections, read by the engine: the artifacts pinned by
digest (their bytes are held to the digest later, by ``engine.workflows``) and the
workers' number, lease, sweep and shutdown grace.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.fields import Reader, describe
from registry_coordinator.authoring.source import DataPath
from registry_coordinator.config.values import (
    read_duration,
    read_integer,
)


@dataclass(frozen=True)
class PinnedWorkflow:
    artifact: Path
    digest: str
    path: DataPath  # where in the configuration it was pinned


@dataclass(frozen=True)
class EngineConfig:
    workers: int
    lease: timedelta
    sweep_interval: timedelta
    shutdown_grace: timedelta


def read_workflows(reader: Reader, value: JSON, base: Path) -> tuple[PinnedWorkflow, ...]:
    path: DataPath = ("workflows",)
    if not isinstance(value, list):
        if value is not None:
            reader.report(
                "field.type",
                f"workflows must be a list, not {describe(value)}",
                "list pinned artifacts: '- artifact: FILE' and 'digest: sha256:...'",
                path,
            )
        return ()
    pinned = []
    for index, item in enumerate(value):
        at = (*path, index)
        data = reader.mapping(item, at, "a pinned workflow")
        if data is None or not reader.fields(data, at, "a pinned workflow", ["artifact", "digest"]):
            continue
        artifact = reader.string(data, "artifact", at, "a pinned workflow")
        digest = reader.string(data, "digest", at, "a pinned workflow")
        if digest is not None and not (digest.startswith("sha256:") and len(digest) == 71):
            reader.report(
                "config.invalid-value",
                f"digest {digest!r} is not sha256:<64 hex digits>",
                "paste the digest coordinator package printed",
                (*at, "digest"),
            )
            continue
        if artifact and digest:
            pinned.append(PinnedWorkflow((base / artifact).resolve(), digest, at))
    return tuple(pinned)


def read_engine(reader: Reader, value: JSON) -> EngineConfig | None:
    path: DataPath = ("engine",)
    data = reader.mapping(value, path, "engine")
    if data is None:
        return None
    reader.fields(data, path, "engine", [], ["workers", "lease", "sweepInterval", "shutdownGrace"])
    workers = read_integer(reader, data, "workers", path, 4, 1, 256)
    lease = read_duration(reader, data, "lease", path, timedelta(seconds=30), timedelta(seconds=2))
    sweep = read_duration(
        reader, data, "sweepInterval", path, timedelta(seconds=30), timedelta(seconds=1)
    )
    grace = read_duration(reader, data, "shutdownGrace", path, timedelta(seconds=10), timedelta(0))
    return EngineConfig(workers, lease, sweep, grace)
