"""Pinned workflows, and the definitions of every run in flight.

At startup each pinned artifact is read, its bytes checked against the pinned
digest, loaded (which re-checks the workflow against its own catalog
descriptors) and stored in the database by digest. New runs start on a pinned
definition; a run admitted under a definition that is no longer pinned keeps
it: its artifact is read back from the database, its digest verified, and built
without being judged again under this build's rules (``load(trusted=True)``), so
a build that tightens a rule does not strand the runs admitted before it.

Loading reports into the configuration's :class:`~registry_coordinator.config.Problems`
rather than raising, and :func:`load_service` looks at all three stages (the file's
structure, the artifacts, the bindings) before refusing with every problem, each at the
field of the configuration it is about.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from registry_coordinator import store
from registry_coordinator.authoring.artifact import load, load_file
from registry_coordinator.authoring.canonical import digest_of
from registry_coordinator.authoring.catalog import Operation, Parameter, builtin_catalog
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.diagnostics import Diagnostic, Refused
from registry_coordinator.authoring.workflow import Call, WaitFor
from registry_coordinator.config import (
    Config,
    ConfigReading,
    ConnectionConfig,
    CustodyConfig,
    PinnedWorkflow,
    Problems,
    read_config,
)
from registry_coordinator.store import operator_actions
from registry_coordinator.store.database import Database


@dataclass(frozen=True)
class Pinned:
    definition: Definition
    digest: str
    artifact: bytes
    pin: PinnedWorkflow | None = None  # where the configuration pins it, if it does


class Workflows:
    """The pinned workflows new runs may start on, and every definition a run is on.

    ``judged`` adds the artifacts refused only for their digest: their bindings are looked
    at too, so the operator who fixes the digest does not meet the next problem at the
    next start. Nothing ever runs on them."""

    def __init__(self, pinned: list[Pinned], mismatched: list[Pinned] | None = None) -> None:
        self.pinned = pinned
        self.judged = [*pinned, *(mismatched or [])]
        self._by_digest = {p.digest: p.definition for p in pinned}

    @classmethod
    def load(cls, pins: tuple[PinnedWorkflow, ...], problems: Problems) -> Workflows:
        """Read and verify every pinned artifact, reporting each one refused to
        ``problems``; the workflows of the rest."""
        pinned: list[Pinned] = []
        mismatched: list[Pinned] = []
        seen: dict[tuple[str, str], str] = {}
        for pin in pins:
            try:
                definition, digest = load_file(pin.artifact)
            except Refused as refused:
                problems.add("workflows", [_at_pin(d, pin, problems) for d in refused.diagnostics])
                continue
            if digest != pin.digest:
                problems.report(
                    "workflows",
                    "config.digest-mismatch",
                    f"{pin.artifact} has digest {digest}, but {pin.digest} is pinned",
                    "pin the digest coordinator package printed for this artifact, "
                    "or restore the artifact that was pinned",
                    (*pin.path, "digest"),
                )
                mismatched.append(Pinned(definition, digest, b"", pin))
                continue
            identity = (definition.id, definition.version)
            if identity in seen and seen[identity] != digest:
                problems.report(
                    "workflows",
                    "config.invalid-value",
                    f"{definition.id} version {definition.version} is pinned twice with "
                    "different digests",
                    "pin each workflow version once; give a changed workflow a new version",
                    pin.path,
                )
                continue
            seen[identity] = digest
            pinned.append(Pinned(definition, digest, pin.artifact.read_bytes(), pin))
        return cls(pinned, mismatched)

    def check_custody(self, custody: CustodyConfig, problems: Problems) -> None:
        """Report every pinned workflow that names its data subject while the configuration
        has no custody keys: its runs' data would be kept in clear, beyond any erasure."""
        if custody.active is not None:
            return
        for pin in self.judged:
            workflow = pin.definition.workflow
            if workflow.subject is None:
                continue
            problems.report(
                "workflows",
                "config.invalid-value",
                f"{workflow.id} version {workflow.version} names its data subject "
                f"({workflow.subject}), and the configuration has no custody keys: its runs' "
                "data would be kept in clear, and could not be erased",
                'give custody: {keys: {"1": file:FILE}, active: 1} '
                "(coordinator keys generate --out FILE makes one)",
                pin.pin.path if pin.pin else ("workflows",),
            )

    def check_bindings(self, products: dict[str, str | None] | None, problems: Problems) -> None:
        """Report every pinned workflow's connection that is not bound to the product kind
        it was checked against, and every connection bound to no product kind at all.
        ``products`` is what the configuration binds each connection name to (None: its
        connections could not be read, which is reported already)."""
        if products is None:
            return
        known = set(builtin_catalog().products)
        for pin in self.judged:
            known.update(pin.definition.workflow.connections.values())
        used: set[str] = set()
        for pin in self.judged:
            workflow = pin.definition.workflow
            for name, kind in workflow.connections.items():
                used.add(name)
                if name not in products:
                    close = difflib.get_close_matches(name, products, n=1)
                    problems.report(
                        "connections",
                        "config.connection-unbound",
                        f"{workflow.id} version {workflow.version} uses connection {name!r} "
                        f"({kind}), which the configuration does not define",
                        f"did you mean connections.{close[0]}? rename it to {name}"
                        if close
                        else f"add connections: {{{name}: {{product: {kind}, baseUrl: ..., "
                        "identity: ...}}",
                        pin.pin.path if pin.pin else ("workflows",),
                    )
                    continue
                bound = products[name]
                if bound is None or bound == kind:  # None: its own problem is reported
                    continue
                unknown = "" if bound in known else ", which is no product kind"
                problems.report(
                    "connections",
                    "config.connection-kind",
                    f"{workflow.id} version {workflow.version} needs connection "
                    f"{name!r} to be {kind}, but it is bound to {bound!r}{unknown}",
                    f"did you mean product: {kind}?"
                    if unknown
                    else f"bind {name} to a {kind} product, or rename the connection",
                    ("connections", name, "product"),
                )
        for name, bound in products.items():
            if name in used or bound is None or bound in known:
                continue
            close = difflib.get_close_matches(bound, sorted(known), n=1)
            problems.report(
                "connections",
                "config.invalid-value",
                f"connection {name} is bound to {bound!r}, which is no product kind",
                f"did you mean product: {close[0]}?"
                if close
                else f"name one of the product kinds: {', '.join(sorted(known))}",
                ("connections", name, "product"),
            )

    def check_connections(
        self, connections: dict[str, ConnectionConfig], problems: Problems
    ) -> None:
        """Report every connection-bound parameter a pinned workflow's operations send
        that its connection does not set, or sets to a value the parameter does not take;
        every parameter a connection sets that its product does not have; and every
        operation bound to a connection whose authority it cannot run under."""
        self._check_authority(connections, problems)
        self._check_reviews(connections, problems)
        wanted: dict[str, dict[str, Parameter]] = {}
        for pin in self.judged:
            definition = pin.definition
            for _, call, operation, _ in self._bound_calls(connections, pin):
                for parameter in operation.bound:
                    wanted.setdefault(call.connection, {})[parameter.name] = parameter
            for step_id, result in definition.results.items():
                wait = definition.step(step_id)
                assert isinstance(wait, WaitFor)
                if _bound_as(connections, wait.connection, result.product):
                    for parameter in result.fetch.bound:
                        wanted.setdefault(wait.connection, {})[parameter.name] = parameter
        catalog = builtin_catalog()
        for name, connection in connections.items():
            at = (*connection.path, "parameters")
            needs = wanted.get(name, {})
            for parameter in needs.values():
                if parameter.name not in connection.parameters:
                    problems.report(
                        "connections",
                        "config.parameter-missing",
                        f"connection {name} must set {connection.product}'s {parameter.name}: "
                        f"{parameter.description}",
                        f"add parameters: {{{parameter.name}: VALUE}} to connection {name}",
                        at,
                    )
                    continue
                wrong = parameter.problem(connection.parameters[parameter.name])
                if wrong:
                    problems.report(
                        "connections",
                        "config.parameter-invalid",
                        f"connection {name} parameter {parameter.name}: {wrong}",
                        f"give {parameter.name} a value {connection.product} takes: "
                        f"{parameter.description}",
                        (*at, parameter.name),
                    )
            product = catalog.products.get(connection.product)
            declared = set(product.parameters) if product else set()
            declared |= set(needs)
            for given in sorted(set(connection.parameters) - declared):
                close = difflib.get_close_matches(given, sorted(declared), n=1)
                problems.report(
                    "connections",
                    "config.parameter-unknown",
                    f"connection {name} sets parameter {given}, which {connection.product} "
                    "does not have",
                    f"did you mean {close[0]}?"
                    if close
                    else f"remove it; {connection.product} takes: "
                    + (", ".join(sorted(declared)) or "no parameters"),
                    (*at, given),
                )

    def _check_authority(
        self, connections: dict[str, ConnectionConfig], problems: Problems
    ) -> None:
        """An operation that runs only under Casework's task authority (a Scheduling
        booking) needs a connection with a ``taskAuthority``; one its product refuses under
        a task grant (a BReg action) needs a connection without."""
        for pin in self.judged:
            definition = pin.definition
            for _, step, operation, connection in self._bound_calls(connections, pin):
                identity = connection.identity
                authority = getattr(identity, "task_authority", None) is not None
                name = f"{operation.product}/{operation.name}"
                at = (*connection.path, "identity")
                if operation.grant == "required" and not authority:
                    problems.report(
                        "connections",
                        "config.task-authority-missing",
                        f"{definition.id} calls {name} on connection {step.connection}, which "
                        "runs only under Casework's task authority",
                        "give the connection's oauth2 identity a taskAuthority: {baseUrl, "
                        "issuer, subject, exchangeAudience, bootstrapResource}",
                        at,
                    )
                if operation.grant is None and authority:
                    problems.report(
                        "connections",
                        "config.task-authority-refused",
                        f"{definition.id} calls {name} on connection {step.connection}, whose "
                        f"taskAuthority {operation.product} refuses for it",
                        "bind the step to a connection of the product's own service identity",
                        at,
                    )

    def _check_reviews(self, connections: dict[str, ConnectionConfig], problems: Problems) -> None:
        """An external read whose path, or a query parameter's name, is written in the
        workflow (not computed) must be one its connection's review allows: refused here
        rather than as each run reaches it (``external-invalid-command``)."""
        for pin in self.judged:
            definition = pin.definition
            for step_id, step, operation, connection in self._bound_calls(connections, pin):
                reviewed = connection.external
                if not operation.external or reviewed is None or not isinstance(step.input, dict):
                    continue
                path, query = step.input.get("path"), step.input.get("query")
                unlisted = []
                if isinstance(path, str) and "${{" not in path and path not in reviewed.paths:
                    unlisted.append(f"path {path!r}")
                names = query if isinstance(query, dict) else {}
                unlisted += [
                    f"query parameter {name!r}"
                    for name in sorted(names)
                    if name not in reviewed.query_parameters
                ]
                for what in unlisted:
                    field = "paths" if what.startswith("path") else "queryParameters"
                    problems.report(
                        "connections",
                        "config.external-unreviewed",
                        f"{definition.id} step {step_id} reads {what} of connection "
                        f"{step.connection}, which its review does not list",
                        f"add it to connections.{step.connection}.{field} once it is "
                        "reviewed, or change the step",
                        (*connection.path, field),
                    )

    @staticmethod
    def _bound_calls(
        connections: dict[str, ConnectionConfig], pin: Pinned
    ) -> Iterator[tuple[str, Call, Operation, ConnectionConfig]]:
        """A pinned workflow's call steps, each with its operation and the connection it is
        bound to — only those bound to the operation's product kind: one that is not, or is
        not configured, is reported as such, and what the operation needs of it is not."""
        definition = pin.definition
        for step_id, operation in definition.operations.items():
            step = definition.step(step_id)
            assert isinstance(step, Call)
            if _bound_as(connections, step.connection, operation.product):
                yield step_id, step, operation, connections[step.connection]

    async def store(self, db: Database) -> None:
        """Keep every pinned definition, and a row its starts may be held by."""
        for pin in self.pinned:
            await store.store_definition(db, pin.definition, pin.digest, pin.artifact)
        await operator_actions.add_workflow_holds(db, [p.definition.id for p in self.pinned])

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


def _bound_as(connections: dict[str, ConnectionConfig], name: str, kind: str) -> bool:
    """Whether connection ``name`` is bound to product ``kind``: one that is not, or is
    not configured, is reported as such, and what ``kind`` would need of it is not."""
    connection = connections.get(name)
    return connection is not None and connection.product == kind


def _at_pin(diagnostic: Diagnostic, pin: PinnedWorkflow, problems: Problems) -> Diagnostic:
    """A refusal of a pinned artifact that points nowhere inside it (it is missing, not
    JSON, not canonical...) points at the configuration field that pins it instead."""
    if diagnostic.position is not None:
        return diagnostic
    message = diagnostic.message
    if str(pin.artifact) not in message:
        message = f"{pin.artifact}: {message}"
    position = problems.source.at((*pin.path, "artifact"))
    return replace(diagnostic, message=message, file=problems.source.file, position=position)


def read_service(path: Path) -> tuple[ConfigReading, Workflows]:
    """A configuration and its pinned workflows, looked at in every stage the structure
    leaves something to look at; the problems are collected in the reading, not raised."""
    reading = read_config(path)
    workflows = Workflows.load(reading.pins, reading.problems)
    workflows.check_bindings(reading.products, reading.problems)
    workflows.check_connections(reading.connections, reading.problems)
    if reading.config is not None:
        workflows.check_custody(reading.config.custody, reading.problems)
    return reading, workflows


def load_service(path: Path) -> tuple[Config, Workflows]:
    """What ``coordinator serve`` runs on; raises :class:`Refused` with every problem of
    the configuration's structure, its artifacts and their bindings at once."""
    reading, workflows = read_service(path)
    reading.problems.refuse()
    assert reading.config is not None
    return reading.config, workflows
