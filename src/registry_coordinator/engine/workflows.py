"""Pinned workflows, and the definitions of every run in flight.

At startup each pinned artifact is read, its bytes checked against the pinned
digest, loaded (which re-checks the workflow against its own catalog
descriptors) and stored in the database by digest. New runs start on a pinned
definition; a run admitted under a definition that is no longer pinned keeps
it: its artifact is read back from the database, its digest verified, and built
without being judged again under this build's rules (``load(trusted=True)``), so
a build that tightens a rule does not strand the runs admitted before it.
"""

from __future__ import annotations

from dataclasses import dataclass

from registry_coordinator.authoring.artifact import load, load_file
from registry_coordinator.authoring.canonical import digest_of
from registry_coordinator.authoring.catalog import builtin_catalog
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.diagnostics import Diagnostic, Refused
from registry_coordinator.engine import store
from registry_coordinator.engine.config import ConnectionConfig, PinnedWorkflow
from registry_coordinator.engine.database import Database


@dataclass(frozen=True)
class Pinned:
    definition: Definition
    digest: str
    artifact: bytes


class Workflows:
    def __init__(self, pinned: list[Pinned]) -> None:
        self.pinned = pinned
        self._by_digest = {p.digest: p.definition for p in pinned}

    @classmethod
    def load(cls, pins: tuple[PinnedWorkflow, ...], config_file: str) -> Workflows:
        """Read and verify every pinned artifact; refuse with every problem at once."""
        problems: list[Diagnostic] = []
        pinned: list[Pinned] = []
        seen: dict[tuple[str, str], str] = {}
        for pin in pins:
            try:
                definition, digest = load_file(pin.artifact)
            except Refused as refused:
                problems.extend(refused.diagnostics)
                continue
            if digest != pin.digest:
                problems.append(
                    Diagnostic(
                        "config.digest-mismatch",
                        f"{pin.artifact} has digest {digest}, but {pin.digest} is pinned",
                        "pin the digest coordinator package printed for this artifact, "
                        "or restore the artifact that was pinned",
                        config_file,
                    )
                )
                continue
            identity = (definition.id, definition.version)
            if identity in seen and seen[identity] != digest:
                problems.append(
                    Diagnostic(
                        "config.invalid-value",
                        f"{definition.id} version {definition.version} is pinned twice with "
                        "different digests",
                        "pin each workflow version once; give a changed workflow a new version",
                        config_file,
                    )
                )
                continue
            seen[identity] = digest
            pinned.append(Pinned(definition, digest, pin.artifact.read_bytes()))
        if problems:
            raise Refused(problems)
        return cls(pinned)

    def check_bindings(self, connections: dict[str, ConnectionConfig], config_file: str) -> None:
        """Refuse unless every pinned workflow's connections are bound to the right product."""
        problems = []
        for pin in self.pinned:
            workflow = pin.definition.workflow
            for name, kind in workflow.connections.items():
                bound = connections.get(name)
                if bound is None:
                    problems.append(
                        Diagnostic(
                            "config.connection-unbound",
                            f"{workflow.id} version {workflow.version} uses connection {name!r} "
                            f"({kind}), which the configuration does not define",
                            f"add connections: {{{name}: {{product: {kind}, baseUrl: ..., "
                            "identity: ...}}",
                            config_file,
                        )
                    )
                elif bound.product != kind:
                    known = set(builtin_catalog().products) | set(workflow.connections.values())
                    unknown = "" if bound.product in known else ", which is no product kind"
                    problems.append(
                        Diagnostic(
                            "config.connection-kind",
                            f"{workflow.id} version {workflow.version} needs connection "
                            f"{name!r} to be {kind}, but it is bound to {bound.product!r}"
                            f"{unknown}",
                            f"did you mean product: {kind}?"
                            if unknown
                            else f"bind {name} to a {kind} product, or rename the connection",
                            config_file,
                        )
                    )
        if problems:
            raise Refused(problems)

    async def store(self, db: Database) -> None:
        for pin in self.pinned:
            await store.store_definition(db, pin.definition, pin.digest, pin.artifact)

    def for_start(self, workflow_id: str, version: str | None) -> Pinned | None:
        """The pinned definition a new start gets: the named version, or the one pinned last."""
        matches = [p for p in self.pinned if p.definition.id == workflow_id]
        if version is not None:
            matches = [p for p in matches if p.definition.version == version]
        return matches[-1] if matches else None

    async def by_digest(self, db: Database, digest: str) -> Definition:
        """The definition a run was admitted under, pinned or not. Raises LookupError when
        it is missing or altered, Refused when this build cannot run it."""
        found = self._by_digest.get(digest)
        if found is None:
            row = await db.row("definition_artifact", {"digest": digest})
            if row is None:
                raise LookupError(f"no definition {digest} in the database")
            data = bytes(row["artifact"])
            if digest_of(data) != digest:
                raise LookupError(f"the stored definition {digest} does not match its digest")
            found = load(data, f"definition {digest}", trusted=True)
            self._by_digest[digest] = found
        return found
