"""The audit commands: ``coordinator audit verify``, ``export``, ``checkpoint``,
``public-key`` and ``keygen``.

``verify`` is the auditor's: with ``--bundle`` it needs nothing but the bundle and the
public key, offline; without, it reads every history in the database, and a history, a
signed head or a checkpoint that does not hold is a line of its own and exit 1, never
only a count. A signing key is written once, readable by its owner only, and never
replaced; a bundle or a checkpoint is written whole or not at all. What the commands are
given but cannot use is :class:`_AuditUsage`, one line and exit 2, before the database is
opened where that can be told from the command line.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from registry_coordinator.cli.keys import new_secret_command, write_new_secret
from registry_coordinator.cli.service import configure_logging, run_service
from registry_coordinator.errors import CoordinatorError, ExitCode

if TYPE_CHECKING:
    from datetime import datetime

    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    from registry_coordinator.audit.histories import Verified
    from registry_coordinator.cli.tree import Commands, Handler
    from registry_coordinator.config import Config
    from registry_coordinator.semantics.checkpoints import Checkpoint
    from registry_coordinator.store.database import Database


def add_commands(commands: Commands) -> None:
    """Histories against their chains and signed checkpoints; bundles for auditors."""
    audit = commands.add_parser(
        "audit", help="verify runs' histories; export a run's bundle; sign checkpoints"
    )
    actions = audit.add_subparsers(dest="audit", required=True, metavar="ACTION")
    verify = actions.add_parser(
        "verify",
        help="every history in the database (or one run's), or a bundle offline: exit 0 or 1",
    )
    verify.add_argument("--config", type=Path, metavar="FILE", help="the service's configuration")
    verify.add_argument("--run", type=uuid.UUID, metavar="ID", help="only this run")
    verify.add_argument(
        "--since", metavar="INSTANT", help="only runs changed since, e.g. 2026-12-01T00:00:00Z"
    )
    verify.add_argument(
        "--bundle", type=Path, metavar="FILE", help="check this bundle offline (no --config)"
    )
    verify.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="check this subject report offline (coordinator subject report; no --config)",
    )
    verify.add_argument(
        "--public-key",
        type=Path,
        metavar="FILE",
        help="the checkpoints' Ed25519 public key, PEM (default: the configured key's)",
    )
    verify.add_argument(
        "--checkpoint",
        type=Path,
        metavar="FILE",
        help="a checkpoint kept elsewhere (audit checkpoint --out) the database must hold",
    )
    export = actions.add_parser("export", help="write one run's bundle, checkable offline")
    export.add_argument("--config", type=Path, required=True, metavar="FILE")
    export.add_argument("--run", type=uuid.UUID, required=True, metavar="ID")
    export.add_argument("--out", type=Path, required=True, metavar="FILE")
    export.add_argument(
        "--record",
        action="store_true",
        help="an auditor's bundle: with the run's input and outputs in clear, for replay",
    )
    replay = actions.add_parser(
        "replay", help="take a bundle's decisions again offline from its record: exit 0 or 1"
    )
    replay.add_argument(
        "--bundle", type=Path, required=True, metavar="FILE", help="an audit export --record"
    )
    replay.add_argument(
        "--public-key",
        type=Path,
        metavar="FILE",
        help="the key that must have signed it, PEM (default: the key it names, unchecked)",
    )
    kept = actions.add_parser(
        "checkpoint", help="sign the heads that changed now; write the latest checkpoint"
    )
    kept.add_argument("--config", type=Path, required=True, metavar="FILE")
    kept.add_argument("--out", type=Path, metavar="FILE", help="write it here to keep elsewhere")
    key = actions.add_parser("public-key", help="print the checkpoints' public key (PEM)")
    key.add_argument("--config", type=Path, required=True, metavar="FILE")
    new_secret_command(
        actions, "keygen", "make an Ed25519 signing key for audit.signingKey; print its public key"
    )

    subject = commands.add_parser("subject", help="what the service holds and did for a person")
    asked = subject.add_subparsers(dest="subject", required=True, metavar="ACTION")
    report = asked.add_parser(
        "report", help="every run and effect of one data subject, as a signed extract"
    )
    report.add_argument("--config", type=Path, required=True, metavar="FILE")
    report.add_argument("--subject", required=True, help="the id the workflow's subject gives")
    report.add_argument("--out", type=Path, required=True, metavar="FILE")


def handlers() -> dict[str, Handler]:
    return {"audit": _audit, "subject": _subject_report}


def _subject_report(args: argparse.Namespace) -> int:
    """The subject's report, signed with the audit key, written to ``--out``: what its
    runs held (null where erased), every request they sent and what came back."""
    from datetime import UTC, datetime

    from registry_coordinator.audit import subjects
    from registry_coordinator.config import load_config

    config = load_config(args.config)
    key = _audit_key(config, "subject report")
    written: list[bytes] = []

    async def work(db: Database) -> None:
        now = datetime.now(UTC)
        written.append(
            await subjects.extract(db, args.subject, now, key, config.retention.directory)
        )

    _audit_database(config, work)
    _write_atomically(args.out, written[0])
    print(
        f"wrote the subject's report to {args.out} ({len(written[0])} bytes), signed with the "
        "audit key: check it offline with coordinator audit verify --report FILE --public-key KEY"
    )
    return ExitCode.OK


def _audit(args: argparse.Namespace) -> int:
    actions = {
        "verify": _audit_verify,
        "export": _audit_export,
        "replay": _audit_replay,
        "checkpoint": _audit_checkpoint,
        "public-key": _audit_public_key,
        "keygen": _audit_keygen,
    }
    return actions[args.audit](args)


class _AuditUsage(CoordinatorError):
    """``coordinator audit`` was given what it cannot use."""

    exit_code = ExitCode.USAGE


def _read(path: Path, what: str) -> bytes:
    """The bytes of ``path``, which holds ``what``; a usage error naming both otherwise."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _AuditUsage(f"cannot read {what} {path}: {exc.strerror}") from None


def _audit_database(config: Config, work: Callable[[Database], Awaitable[None]]) -> None:
    """Run ``work`` with the configured database, as the audit commands' one step online."""
    from registry_coordinator.service import open_database

    async def run() -> None:
        async with open_database(config, "coordinator/audit") as db:
            await work(db)

    configure_logging()
    run_service(run)


def _audit_key(config: Config, action: str) -> Ed25519PrivateKey:
    key = config.audit.signing_key
    if key is None:
        raise _AuditUsage(
            f"audit {action} needs the checkpoints' signing key, and the configuration has no "
            "audit signingKey: give audit: {signingKey: file:/path/to/audit-key.pem}"
        )
    return key


def _public_key_file(path: Path) -> Ed25519PublicKey:
    from registry_coordinator.semantics.checkpoints import UnusableKey, public_key

    data = _read(path, "the public key")
    try:
        return public_key(data)
    except UnusableKey as exc:
        raise _AuditUsage(f"the public key {path} cannot be used: {exc}") from None


def _audit_verify(args: argparse.Namespace) -> int:
    """One line for each history or checkpoint that does not hold (exit 1), or the
    counts of what was checked (exit 0); with ``--bundle``, what the bundle proves."""
    if args.bundle is not None and args.report is not None:
        raise _AuditUsage("audit verify checks a --bundle or a --report: give one")
    if args.bundle is not None:
        return _verify_bundle(args)
    if args.report is not None:
        return _verify_report(args)
    return _verify_database(args)


def _offline_key(args: argparse.Namespace, what: str) -> Ed25519PublicKey:
    """The public key an offline check of ``what`` (``bundle``, ``report``) is against."""
    if args.config or args.run or args.since or args.checkpoint:
        raise _AuditUsage(
            f"audit verify --{what} checks the {what} alone: give no --config, "
            "--run, --since or --checkpoint"
        )
    if args.public_key is None:
        raise _AuditUsage(
            f"audit verify --{what} needs --public-key FILE, the key that signed it "
            "(coordinator audit public-key prints it)"
        )
    return _public_key_file(args.public_key)


def _verify_report(args: argparse.Namespace) -> int:
    """What a subject report holds, checked offline against the public key given."""
    from registry_coordinator.semantics import reports
    from registry_coordinator.semantics.bundles import Refused

    key = _offline_key(args, "report")
    data = _read(args.report, "the report")
    try:
        report = reports.check(data, key)
    except Refused as exc:
        print(f"report {args.report}: {exc}")
        print(f"the report {args.report} does not hold", file=sys.stderr)
        return ExitCode.INVALID
    assert isinstance(report, dict)
    runs, archived = report.get("runs"), report.get("archived")
    print(
        f"report of {report.get('at')}: signed by the key given; "
        f"{len(runs) if isinstance(runs, list) else 0} runs in the database, "
        f"{len(archived) if isinstance(archived, list) else 0} archived"
    )
    return ExitCode.OK


def _verify_bundle(args: argparse.Namespace) -> int:
    """What one bundle proves, checked offline against the public key given."""
    from registry_coordinator.semantics import bundles

    key = _offline_key(args, "bundle")
    data = _read(args.bundle, "the bundle")
    try:
        proven = bundles.check(data, key)
    except bundles.Refused as exc:
        print(f"bundle {args.bundle}: {exc}")
        print(f"the bundle {args.bundle} does not hold", file=sys.stderr)
        return ExitCode.INVALID
    unsigned = proven.events - proven.signed
    print(
        f"bundle of run {proven.run}: {proven.events} events chained, the first "
        f"{proven.signed} under checkpoint {proven.checkpoint} ({proven.checkpoint_at}) "
        f"signed by the key given" + (f"; the last {unsigned} chained only" if unsigned else "")
    )
    print(
        f"workflow {proven.workflow} {proven.version} ({proven.digest}); last event: {proven.last}"
    )
    return ExitCode.OK


def _verify_database(args: argparse.Namespace) -> int:
    """Every history in the database (or one run's) against its chain and the signed heads,
    and the checkpoints against the key and a checkpoint kept elsewhere, if given."""
    from registry_coordinator.audit import histories
    from registry_coordinator.config import load_config

    if args.config is None:
        raise _AuditUsage("audit verify needs --config FILE (the database) or --bundle FILE")
    since = None if args.since is None else _since(args.since)
    config = load_config(args.config)
    key = None
    if args.public_key is not None:
        key = _public_key_file(args.public_key)
    elif config.audit.signing_key is not None:
        key = config.audit.signing_key.public_key()
    kept = None
    if args.checkpoint is not None:
        if key is None:
            raise _AuditUsage("audit verify --checkpoint needs the public key: --public-key FILE")
        kept = _kept_checkpoint(args.checkpoint, key)
    found: list[Verified] = []

    async def work(db: Database) -> None:
        found.append(
            await histories.verify(db, args.run, since, key, kept, config.retention.directory)
        )

    _audit_database(config, work)
    [verified] = found
    return _report(verified, args.run, key)


def _since(text: str) -> datetime:
    from registry_coordinator.authoring.expressions import parse_instant

    try:
        return parse_instant(text)
    except ValueError:
        raise _AuditUsage(
            f"audit verify: --since {text!r} is not an RFC 3339 instant, e.g. 2026-12-01T00:00:00Z"
        ) from None


def _report(verified: Verified, run: uuid.UUID | None, key: Ed25519PublicKey | None) -> int:
    """Each break on its line of stdout, then what was verified, or why it does not hold,
    with each erased data subject's key: when, by whom, why, and what it sealed."""
    from registry_coordinator.authoring.expressions import format_instant

    for broken in verified.breaks:
        print(f"run {broken.run}: event {broken.seq}: {broken.why}")
    for number, why in verified.checkpoint_breaks:
        print(f"checkpoint {number}: {why}")
    what = (
        f"{verified.runs} runs, {verified.events} events, {verified.heads} signed heads, "
        f"{verified.checkpoints} checkpoints"
    )
    if verified.archived:
        what += f", {verified.archived} archived runs ({verified.bundles} bundles read)"
    if verified.breaks or verified.checkpoint_breaks:
        print(f"{what}: the history does not hold", file=sys.stderr)
        return ExitCode.INVALID
    if run is not None and verified.runs == 0 and verified.moved is None:
        print(
            f"coordinator audit verify: no run {run}: it is not in the database, not "
            "archived, and no checkpoint signed it; check the id",
            file=sys.stderr,
        )
        return ExitCode.INVALID
    if key is None:
        print(
            "checkpoint signatures were not checked: no --public-key and no audit signingKey",
            file=sys.stderr,
        )
    if run is not None and verified.moved is not None:
        moved = verified.moved
        read = " and its bundle holds" if verified.bundles else ""
        print(
            f"run {run} is archived, to the bundle {moved.bundle}: its record holds the head "
            f"a checkpoint signed (event {moved.seq}){read}; check the bundle offline with "
            "coordinator audit verify --bundle FILE --public-key KEY"
        )
        return ExitCode.OK
    for erased in verified.erasures:
        why = erased.reason if erased.reason is not None else "sealed: give custody keys to read"
        print(
            f"data key {erased.key} was erased at {format_instant(erased.at)} by "
            f"{erased.actor} ({why}): {erased.runs} runs, {erased.events} events in the "
            "database hold values sealed under it, now unreadable; their chain holds"
        )
    print(f"verified {what}: every history holds its chain and its signed heads")
    return ExitCode.OK


def _kept_checkpoint(path: Path, key: Ed25519PublicKey) -> Checkpoint:
    """A checkpoint kept elsewhere, read and checked against ``key``."""
    from registry_coordinator.semantics import bundles
    from registry_coordinator.semantics.chain import parse
    from registry_coordinator.semantics.checkpoints import signed_by

    data = _read(path, "the checkpoint")
    try:
        kept = bundles.read_checkpoint(parse(data))
    except (ValueError, RecursionError, bundles.Refused) as exc:
        raise _AuditUsage(f"the checkpoint {path} is not one: {exc}") from None
    why = signed_by(kept, key)
    if why is not None:
        raise _AuditUsage(f"the checkpoint {path} cannot be trusted: {why}")
    return kept


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.partial")
    try:
        temporary.write_bytes(data)
        temporary.replace(path)
    except OSError as exc:
        raise _AuditUsage(f"cannot write {path}: {exc.strerror}") from None


def _audit_export(args: argparse.Namespace) -> int:
    from registry_coordinator.audit import histories
    from registry_coordinator.config import load_config

    config = load_config(args.config)
    key = _audit_key(config, "export")
    written: list[bytes] = []

    async def work(db: Database) -> None:
        written.append(await histories.export(db, args.run, key, record=args.record))

    _audit_database(config, work)
    _write_atomically(args.out, written[0])
    kind = "an auditor's bundle (its record in clear)" if args.record else "the bundle"
    print(f"wrote {kind} of run {args.run} to {args.out} ({len(written[0])} bytes)")
    return ExitCode.OK


def _audit_replay(args: argparse.Namespace) -> int:
    """The bundle's decisions taken again from its record, each one a line; the first
    event that does not follow, and exit 1, if one does not."""
    from registry_coordinator.authoring import artifact
    from registry_coordinator.authoring.diagnostics import Refused as Unloadable
    from registry_coordinator.semantics import bundles, replay

    data = _read(args.bundle, "the bundle")
    named = args.public_key is None
    try:
        key = bundles.named_key(data) if named else _public_key_file(args.public_key)
        proven = bundles.check(data, key)
    except bundles.Refused as exc:
        print(f"bundle {args.bundle}: {exc}")
        print(f"the bundle {args.bundle} does not hold", file=sys.stderr)
        return ExitCode.INVALID
    if proven.record is None:
        raise _AuditUsage(
            f"the bundle {args.bundle} holds no record to replay: write one with coordinator "
            "audit export --run ID --record (an archived run's bundle never holds one)"
        )
    try:
        definition = artifact.load(proven.artifact, "the bundle's artifact", trusted=True)
    except Unloadable as exc:
        raise _AuditUsage(f"the bundle's artifact cannot be run by this build: {exc}") from None
    try:
        replayed = replay.replay(definition, proven.run, proven.history, proven.record)
    except replay.Diverged as exc:
        print(f"bundle {args.bundle}: run {proven.run}: {exc}")
        print(f"the history of run {proven.run} does not follow from its record", file=sys.stderr)
        return ExitCode.INVALID
    for decision in replayed.decisions:
        print(f"event {decision.seq} at {decision.step}: {decision.said}")
    where = f"ended {replayed.ended}" if replayed.ended else f"live at step {replayed.step}"
    signer = "the key it names, not checked against one given" if named else "the key given"
    print(
        f"run {proven.run} ({proven.workflow} {proven.version}): {len(replayed.decisions)} "
        f"decisions follow from its record, signed by {signer}; {where}"
    )
    return ExitCode.OK


def _audit_checkpoint(args: argparse.Namespace) -> int:
    from registry_coordinator.audit.checkpointer import checkpoint, stored
    from registry_coordinator.config import load_config
    from registry_coordinator.semantics.chain import canonical

    config = load_config(args.config)
    key = _audit_key(config, "checkpoint")
    latest: list[Checkpoint] = []

    async def work(db: Database) -> None:
        await checkpoint(db, key)
        row = await db.row("audit_last_checkpoint")
        if row is not None:
            latest.append(stored(row))

    _audit_database(config, work)
    if not latest:
        print("there is no checkpoint yet: no run has a history to sign", file=sys.stderr)
        return ExitCode.INVALID
    [made] = latest
    text = canonical(made.as_json()) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        _write_atomically(args.out, text.encode("utf-8"))
    print(f"checkpoint {made.number} ({made.at}) signs {made.leaves} heads", file=sys.stderr)
    return ExitCode.OK


def _audit_keygen(args: argparse.Namespace) -> int:
    """A new signing key, readable by its owner only, written where none is; its public
    key (PEM) on stdout, for auditors."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from registry_coordinator.semantics.checkpoints import public_pem

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_new_secret(args.out, pem, "a signing key")
    sys.stdout.write(public_pem(key.public_key()))
    return ExitCode.OK


def _audit_public_key(args: argparse.Namespace) -> int:
    from registry_coordinator.config import load_config
    from registry_coordinator.semantics.checkpoints import public_pem

    key = _audit_key(load_config(args.config), "public-key")
    sys.stdout.write(public_pem(key.public_key()))
    return ExitCode.OK
