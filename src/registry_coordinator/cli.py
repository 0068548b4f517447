"""The ``coordinator`` command line.

Exit codes everywhere (``errors.ExitCode``): 0 ok, 1 refused or invalid, 2 usage,
3 unavailable. User mistakes are reported as diagnostics, never as tracebacks: an error
of the product's own (``errors.CoordinatorError``) that reaches :func:`main` is printed
as its one line (a refusal as its diagnostics) and ends the command with its exit code.
The service's modules (Trio, psycopg, Quart) are imported only by the commands that run
it, so the offline authoring commands start quickly; the authoring modules (the checker,
artifacts, scenarios) only by the commands that read workflows, so the remote, token and
audit commands start quickly too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry_coordinator import __version__
from registry_coordinator.authoring.diagnostics import Diagnostic, Refused, Severity, sort_key
from registry_coordinator.authoring.durations import format_duration
from registry_coordinator.errors import CoordinatorError, ExitCode

if TYPE_CHECKING:
    from registry_coordinator.authoring.artifact import Checked
    from registry_coordinator.authoring.graph import Facts


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own exit code is already 2
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    # httpx imports its own command line (click, rich and pygments: a tenth of a second of
    # every start) whenever they are installed, as the test tools install them; nothing
    # here uses it, so it is kept out before the remote commands bring httpx in.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    from registry_coordinator.http import remote

    parser = _Parser(prog="coordinator", description="Registry Coordinator: durable workflows")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _authoring_commands(commands)
    _service_commands(commands)
    _audit_commands(commands)
    remote.add_arguments(commands)
    _tutorial_commands(commands)
    return parser


def _authoring_commands(commands: argparse._SubParsersAction[_Parser]) -> None:
    """The offline commands: check, test, package, digest and draw workflows."""
    check = commands.add_parser("check", help="check workflows offline")
    check.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="workflow.yaml files or workflow directories",
    )
    check.add_argument("--format", choices=["text", "json"], default="text")
    check.add_argument("--explain", action="store_true", help="print the graph's facts")

    test = commands.add_parser("test", help="run a workflow's scenarios on a virtual clock")
    test.add_argument("path", type=Path, metavar="PATH")
    test.add_argument(
        "--scenarios",
        type=Path,
        metavar="FILE",
        help="scenarios file (default: scenarios.yaml beside the workflow)",
    )
    test.add_argument("--format", choices=["text", "json"], default="text")

    package = commands.add_parser("package", help="write the immutable artifact, print its digest")
    package.add_argument("path", type=Path, metavar="PATH")
    package.add_argument("--output", type=Path, required=True, metavar="DIR")

    digest = commands.add_parser("digest", help="verify an artifact and print its digest")
    digest.add_argument("artifact", type=Path, metavar="ARTIFACT")

    graph = commands.add_parser("graph", help="draw a workflow (source or artifact)")
    graph.add_argument("path", type=Path, metavar="PATH")
    graph.add_argument("--format", choices=["mermaid", "dot"], default="mermaid")

    catalog = commands.add_parser(
        "catalog", help="the products' operations and results a workflow may use, with schemas"
    )
    catalog.add_argument("product", nargs="?", metavar="PRODUCT", help="e.g. messaging")
    catalog.add_argument("operation", nargs="?", metavar="OPERATION", help="e.g. submit-message")


def _audit_commands(commands: argparse._SubParsersAction[_Parser]) -> None:
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
    kept = actions.add_parser(
        "checkpoint", help="sign the heads that changed now; write the latest checkpoint"
    )
    kept.add_argument("--config", type=Path, required=True, metavar="FILE")
    kept.add_argument("--out", type=Path, metavar="FILE", help="write it here to keep elsewhere")
    key = actions.add_parser("public-key", help="print the checkpoints' public key (PEM)")
    key.add_argument("--config", type=Path, required=True, metavar="FILE")
    keygen = actions.add_parser(
        "keygen", help="make an Ed25519 signing key for audit.signingKey; print its public key"
    )
    keygen.add_argument("--out", type=Path, required=True, metavar="FILE", help="never replaced")


def _service_commands(commands: argparse._SubParsersAction[_Parser]) -> None:
    """Running the service, and the stand-in products and tokens to try it with."""
    serve = commands.add_parser("serve", help="run the service")
    serve.add_argument("--config", type=Path, required=True, metavar="FILE")
    serve.add_argument(
        "--processes",
        type=_positive,
        default=1,
        metavar="N",
        help="run N service processes sharing listen.port, each its own lease holder, "
        "under one supervisor (about one per core); 1, the default, runs one and no supervisor",
    )
    serve.add_argument(
        "--process-ports",
        type=_positive,
        metavar="FIRST",
        help="with --processes: also serve process k (from 0) alone on port FIRST+k of "
        "listen.host, its own /metrics and /ready, for scraping each process",
    )
    # How a supervisor starts its processes (processes.Supervisor); not for people.
    serve.add_argument("--child", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--process-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--supervisor-fd", type=int, help=argparse.SUPPRESS)

    migrate = commands.add_parser("migrate", help="apply pending database schema migrations")
    migrate.add_argument("--config", type=Path, required=True, metavar="FILE")

    doctor = commands.add_parser(
        "doctor", help="look at everything a start needs, one line each: exit 0, 1 or 3"
    )
    doctor.add_argument("--config", type=Path, required=True, metavar="FILE")

    stand_ins = commands.add_parser(
        "stand-ins", help="serve stand-in Registry Stack products (demo and tests only)"
    )
    stand_ins.add_argument(
        "--product",
        action="append",
        default=[],
        metavar="NAME=PORT",
        help="serve a product (breg, casework, messaging, scheduling) or the token endpoint (idp)",
    )
    stand_ins.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="where a product pushes what it completes (casework: its review.completed "
        "destination; Messaging pushes nothing)",
    )
    stand_ins.add_argument(
        "--delivery-delay",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how long Messaging's provider takes to deliver a message (negative: never)",
    )
    stand_ins.add_argument(
        "--issuer",
        type=int,
        metavar="PORT",
        help="serve a stand-in OpenID Connect issuer at http://127.0.0.1:PORT for the console",
    )
    stand_ins.add_argument(
        "--issuer-key",
        type=Path,
        metavar="PATH",
        help="the issuer's Ed25519 development key (created if missing, its JWKS beside it)",
    )
    stand_ins.add_argument(
        "--audience",
        metavar="AUD",
        help="the audience of the issuer's access tokens (default: registry-coordinator)",
    )
    stand_ins.add_argument(
        "--token-lifetime",
        type=int,
        metavar="SECONDS",
        help="how long the issuer's tokens live (default: 3600)",
    )

    token = commands.add_parser(
        "token", help="mint a short-lived token from a local development key (demo, tests)"
    )
    token.add_argument(
        "--key",
        type=Path,
        required=True,
        metavar="FILE",
        help="the development key (created, with FILE.jwks.json, if missing)",
    )
    token.add_argument("--client", required=True, help="the client id the token names")
    token.add_argument("--scope", action="append", default=[], help="a scope (repeat for more)")
    token.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the service configuration whose auth.maxLifetime caps --lifetime",
    )
    token.add_argument(
        "--lifetime",
        default="PT15M",
        help="ISO 8601 duration (default PT15M), at most the auth.maxLifetime of --config, "
        "or PT1H, that field's default, without one",
    )
    token.add_argument("--issuer", default=None, help="the iss claim")
    token.add_argument("--audience", default=None, help="the aud claim")


def _tutorial_commands(commands: argparse._SubParsersAction[_Parser]) -> None:
    """The tutorial: the demo end to end, and deciding its review by hand."""
    demo = commands.add_parser("demo", help="run the tutorial end to end on this machine")
    demo.add_argument("--workflows", type=Path, default=Path("workflows"), metavar="DIR")
    demo.add_argument(
        "--data",
        type=Path,
        default=Path("var/demo"),
        metavar="DIR",
        help="where the demo keeps its database, files and logs (%(default)s)",
    )
    demo.add_argument(
        "--interactive",
        action="store_true",
        help="wait for you to approve the review, with the command to do it",
    )
    demo.add_argument(
        "--keep-running",
        action="store_true",
        help="leave everything running afterwards, until Ctrl-C",
    )

    review = commands.add_parser(
        "review", help="decide a review as a staff member of the stand-in Casework"
    )
    review.add_argument("request", help="the review request's id (a UUID)")
    review.add_argument("decision", choices=["approve", "reject", "changes-requested", "answer"])
    review.add_argument(
        "--casework", required=True, metavar="URL", help="the stand-in Casework's base URL"
    )
    review.add_argument(
        "--outcome", metavar="ID", help="the decision's outcome (all but approve name one)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from registry_coordinator.http import remote  # after _parser(), which keeps httpx's CLI out

    handler = {
        "check": _check,
        "test": _test,
        "package": _package,
        "digest": _digest,
        "graph": _graph,
        "catalog": _catalog,
        "serve": _serve,
        "migrate": _migrate,
        "doctor": _doctor,
        "audit": _audit,
        "stand-ins": _stand_ins,
        "token": _token,
        "runs": remote.run,
        "admission": remote.run,
        "demo": _demo,
        "review": _review,
    }[args.command]
    try:
        code = handler(args)
        sys.stdout.flush()  # a pipe closed early fails here, if not before
        return code
    except BrokenPipeError:
        # Whoever reads stdout stopped (`| head`, `| grep -q`): that ends the command,
        # quietly and as a success, and Python's own flush at exit must not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK
    except Refused as refused:  # every reason, each on its line with its position
        _print_diagnostics(refused.diagnostics)
        return refused.exit_code
    except CoordinatorError as error:
        print(f"coordinator: {error.line()}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


def _print_diagnostics(diagnostics: Sequence[Diagnostic]) -> None:
    for diagnostic in sorted(diagnostics, key=sort_key):
        print(diagnostic.as_text(), file=sys.stderr)


def _check(args: argparse.Namespace) -> int:
    from registry_coordinator.authoring.artifact import check_source

    reports = [check_source(path) for path in args.paths]
    if args.format == "json":
        print(
            json.dumps(
                {
                    "ok": all(r.definition for r in reports),
                    "workflows": [_check_json(r, args.explain) for r in reports],
                },
                indent=2,
            )
        )
    else:
        for report in reports:
            _print_diagnostics(report.diagnostics)
            if report.definition is not None:
                wf = report.definition.workflow
                print(f"ok {report.file}: {wf.id} version {wf.version} {report.digest}")
                if args.explain:
                    print(_facts_text(_facts(report)))
    return ExitCode.OK if all(r.definition for r in reports) else ExitCode.INVALID


def _facts(report: Checked) -> Facts:
    from registry_coordinator.authoring.graph import facts

    assert report.definition is not None
    definition = report.definition
    return facts(definition.workflow, lambda step: definition.operations[step.id].is_mutation)


def _facts_text(found: Facts) -> str:
    lines = [
        f"  paths: {found.path_count}",
        f"  most calls in one run: {found.max_calls}",
        f"  most mutations in one run: {found.max_mutations}",
        f"  longest total wait with timeouts: {format_duration(found.longest_bounded_wait)}"
        + (
            " (some waits are open-ended, bounded by the deadline "
            f"{format_duration(found.deadline)})"
            if found.open_ended_wait
            else ""
        ),
    ]
    for path, mutations in zip(found.paths, found.mutations_per_path, strict=True):
        lines.append(
            f"  - {' -> '.join(path)}  ({mutations} mutation{'s' if mutations != 1 else ''})"
        )
    if found.path_count > len(found.paths):
        lines.append("  (too many paths to list)")
    return "\n".join(lines)


def _check_json(report: Checked, explain: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "file": report.file,
        "ok": report.definition is not None,
        "diagnostics": [d.as_json() for d in sorted(report.diagnostics, key=sort_key)],
    }
    if report.definition is not None:
        entry.update(
            id=report.definition.id, version=report.definition.version, digest=report.digest
        )
        if explain:
            found = _facts(report)
            entry["facts"] = {
                "pathCount": found.path_count,
                "paths": [
                    {"steps": p, "mutations": m}
                    for p, m in zip(found.paths, found.mutations_per_path, strict=True)
                ],
                "maxCalls": found.max_calls,
                "maxMutations": found.max_mutations,
                "longestBoundedWait": format_duration(found.longest_bounded_wait),
                "openEndedWait": found.open_ended_wait,
                "deadline": format_duration(found.deadline),
            }
    return entry


def _checked(path: Path) -> Checked:
    from registry_coordinator.authoring.artifact import check_source

    report = check_source(path)
    if report.definition is None:
        raise Refused(report.diagnostics)
    _print_diagnostics([d for d in report.diagnostics if d.severity is Severity.WARNING])
    return report


def _test(args: argparse.Namespace) -> int:
    from registry_coordinator.authoring.artifact import workflow_file
    from registry_coordinator.authoring.source import load_yaml, read_source
    from registry_coordinator.semantics.scenarios import read_scenarios, run_all

    report = _checked(args.path)
    assert report.definition is not None
    scenarios_file = args.scenarios or workflow_file(args.path).parent / "scenarios.yaml"
    document, source = load_yaml(read_source(scenarios_file), str(scenarios_file))
    scenarios = read_scenarios(document, source, report.definition)
    outcomes = run_all(report.definition, scenarios, str(scenarios_file))
    failed = [name for name, _, problems in ((s.name, o, p) for s, o, p in outcomes) if problems]
    if args.format == "json":
        print(
            json.dumps(
                {
                    "ok": not failed,
                    "scenarios": [
                        {
                            "name": s.name,
                            "ok": not p,
                            "path": o.path,
                            "state": o.state,
                            "outcome": o.outcome,
                            "output": o.output,
                            "failure": o.failure,
                            "hold": o.hold,
                            "elapsed": format_duration(o.elapsed),
                            "mismatches": p,
                        }
                        for s, o, p in outcomes
                    ],
                },
                indent=2,
            )
        )
    else:
        for scenario, ended, problems in outcomes:
            status = "ok  " if not problems else "FAIL"
            summary = ended.outcome or ended.failure or ended.hold or ""
            print(
                f"{status} {scenario.name}: {ended.state} {summary} after "
                f"{format_duration(ended.elapsed)} via {' -> '.join(ended.path)}"
            )
            for problem in problems:
                print(f"     {problem}")
        print(f"{len(outcomes) - len(failed)} of {len(outcomes)} scenarios passed")
    return ExitCode.INVALID if failed else ExitCode.OK


def _package(args: argparse.Namespace) -> int:
    from registry_coordinator.authoring.artifact import write

    report = _checked(args.path)
    assert report.definition is not None and report.artifact is not None
    target = write(report.artifact, report.definition, args.output)
    print(f"wrote {target}", file=sys.stderr)
    print(report.digest)
    return ExitCode.OK


def _digest(args: argparse.Namespace) -> int:
    from registry_coordinator.authoring.artifact import load_file

    _, digest = load_file(args.artifact)
    print(digest)
    return ExitCode.OK


def _graph(args: argparse.Namespace) -> int:
    from registry_coordinator.authoring.artifact import load_file
    from registry_coordinator.authoring.drawing import dot, mermaid

    if args.path.suffix == ".json":
        definition, _ = load_file(args.path)
    else:
        report = _checked(args.path)
        assert report.definition is not None
        definition = report.definition
    draw = mermaid if args.format == "mermaid" else dot
    sys.stdout.write(draw(definition.workflow))
    return ExitCode.OK


def _catalog(args: argparse.Namespace) -> int:
    from registry_coordinator.authoring import reference
    from registry_coordinator.authoring.catalog import builtin_catalog

    try:
        sys.stdout.write(reference.text(builtin_catalog(), args.product, args.operation))
    except reference.Unknown as exc:
        print(f"coordinator catalog: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    return ExitCode.OK


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def _serve(args: argparse.Namespace) -> int:
    from registry_coordinator.addresses import require_free
    from registry_coordinator.engine.workflows import load_service
    from registry_coordinator.service import Seat, serve

    _logging(args.child)
    config, workflows = load_service(args.config)  # every problem of every stage at once
    if args.child is not None:  # a supervisor's process: the supervisor checked the rest
        seat = Seat.child(args.child, args.listen_fd, args.supervisor_fd, args.process_fd)
        return _run_service(lambda: serve(config, workflows, seat))
    if args.processes > 1:
        from registry_coordinator.processes import Supervisor

        return _run_service(Supervisor(config, args.processes, args.process_ports).run)
    if args.process_ports is not None:
        print(
            "coordinator serve: --process-ports is for --processes 2 or more: one process "
            "alone is reached on listen.port",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    where = f"listen.host, listen.port in {config.file}"
    require_free(config.host, config.port, where, "give listen.port another port")
    return _run_service(lambda: serve(config, workflows))


def _doctor(args: argparse.Namespace) -> int:
    from registry_coordinator.doctor import doctor

    return doctor(args.config)


def _migrate(args: argparse.Namespace) -> int:
    from registry_coordinator.config import load_config
    from registry_coordinator.service import open_database_unchecked
    from registry_coordinator.store.migrations import check_server, migrate

    _logging()
    config = load_config(args.config)

    async def run() -> None:
        async with open_database_unchecked(config) as db:
            await check_server(db)
            applied = await migrate(db)
            for migration in applied:
                print(f"applied {migration.version:04d} {migration.name}")
            if not applied:
                print("the schema is current")

    return _run_service(run)


def _audit(args: argparse.Namespace) -> int:
    actions = {
        "verify": _audit_verify,
        "export": _audit_export,
        "checkpoint": _audit_checkpoint,
        "public-key": _audit_public_key,
        "keygen": _audit_keygen,
    }
    return actions[args.audit](args)


class _AuditUsage(CoordinatorError):
    """``coordinator audit`` was given what it cannot use."""

    exit_code = ExitCode.USAGE


def _audit_database(config: Any, work: Callable[[Any], Awaitable[None]]) -> None:
    """Run ``work`` with the configured database, as the audit commands' one step online."""
    from registry_coordinator.service import open_database

    async def run() -> None:
        async with open_database(config, "coordinator/audit") as db:
            await work(db)

    _logging()
    _run_service(run)


def _audit_key(config: Any, action: str) -> Any:
    key = config.audit.signing_key
    if key is None:
        raise _AuditUsage(
            f"audit {action} needs the checkpoints' signing key, and the configuration has no "
            "audit signingKey: give audit: {signingKey: file:/path/to/audit-key.pem}"
        )
    return key


def _public_key_file(path: Path) -> Any:
    from registry_coordinator.semantics.checkpoints import UnusableKey, public_key

    try:
        return public_key(path.read_bytes())
    except OSError as exc:
        raise _AuditUsage(f"cannot read the public key {path}: {exc.strerror}") from None
    except UnusableKey as exc:
        raise _AuditUsage(f"the public key {path} cannot be used: {exc}") from None


def _audit_verify(args: argparse.Namespace) -> int:
    """One line for each history or checkpoint that does not hold (exit 1), or the
    counts of what was checked (exit 0); with ``--bundle``, what the bundle proves."""
    from registry_coordinator.audit import histories
    from registry_coordinator.authoring.expressions import parse_instant
    from registry_coordinator.config import load_config
    from registry_coordinator.semantics import bundles

    if args.bundle is not None:
        if args.config or args.run or args.since or args.checkpoint:
            raise _AuditUsage(
                "audit verify --bundle checks the bundle alone: give no --config, "
                "--run, --since or --checkpoint"
            )
        if args.public_key is None:
            raise _AuditUsage(
                "audit verify --bundle needs --public-key FILE, the key that "
                "signed its checkpoint (coordinator audit public-key prints it)"
            )
        key = _public_key_file(args.public_key)
        try:
            data = args.bundle.read_bytes()
        except OSError as exc:
            raise _AuditUsage(f"cannot read the bundle {args.bundle}: {exc.strerror}") from None
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
            f"workflow {proven.workflow} {proven.version} ({proven.digest}); "
            f"last event: {proven.last}"
        )
        return ExitCode.OK
    if args.config is None:
        raise _AuditUsage("audit verify needs --config FILE (the database) or --bundle FILE")
    since = None
    if args.since is not None:
        try:
            since = parse_instant(args.since)
        except ValueError:
            raise _AuditUsage(
                f"audit verify: --since {args.since!r} is not an RFC 3339 instant, "
                "e.g. 2026-12-01T00:00:00Z"
            ) from None
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
    found: list[histories.Verified] = []

    async def work(db: Any) -> None:
        found.append(
            await histories.verify(db, args.run, since, key, kept, config.retention.directory)
        )

    _audit_database(config, work)
    [verified] = found
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
    if args.run is not None and verified.runs == 0:
        print(f"coordinator audit verify: no run {args.run}", file=sys.stderr)
        return ExitCode.INVALID
    if key is None:
        print(
            "checkpoint signatures were not checked: no --public-key and no audit signingKey",
            file=sys.stderr,
        )
    print(f"verified {what}: every history holds its chain and its signed heads")
    return ExitCode.OK


def _kept_checkpoint(path: Path, key: Any) -> Any:
    """A checkpoint kept elsewhere, read and checked against ``key``."""
    from registry_coordinator.semantics import bundles
    from registry_coordinator.semantics.chain import parse
    from registry_coordinator.semantics.checkpoints import signed_by

    try:
        kept = bundles.read_checkpoint(parse(path.read_bytes()))
    except OSError as exc:
        raise _AuditUsage(f"cannot read the checkpoint {path}: {exc.strerror}") from None
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

    async def work(db: Any) -> None:
        written.append(await histories.export(db, args.run, key))

    _audit_database(config, work)
    _write_atomically(args.out, written[0])
    print(f"wrote the bundle of run {args.run} to {args.out} ({len(written[0])} bytes)")
    return ExitCode.OK


def _audit_checkpoint(args: argparse.Namespace) -> int:
    from registry_coordinator.audit.checkpointer import checkpoint, stored
    from registry_coordinator.config import load_config
    from registry_coordinator.semantics.chain import canonical

    config = load_config(args.config)
    key = _audit_key(config, "checkpoint")
    latest: list[Any] = []

    async def work(db: Any) -> None:
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
    try:
        descriptor = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise _AuditUsage(f"{args.out} exists, and a signing key is never replaced") from None
    except OSError as exc:
        raise _AuditUsage(f"cannot write {args.out}: {exc.strerror}") from None
    with os.fdopen(descriptor, "wb") as out:
        out.write(pem)
    sys.stdout.write(public_pem(key.public_key()))
    return ExitCode.OK


def _audit_public_key(args: argparse.Namespace) -> int:
    from registry_coordinator.config import load_config
    from registry_coordinator.semantics.checkpoints import public_pem

    key = _audit_key(load_config(args.config), "public-key")
    sys.stdout.write(public_pem(key.public_key()))
    return ExitCode.OK


def _token(args: argparse.Namespace) -> int:
    from registry_coordinator.authoring.durations import DurationError, parse_duration
    from registry_coordinator.http.auth import (
        DEVELOPMENT_AUDIENCE,
        DEVELOPMENT_ISSUER,
        development_key,
        jwks_path,
        mint,
    )

    try:
        lifetime = parse_duration(args.lifetime)
    except DurationError as exc:
        print(f"coordinator token: --lifetime: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    # A token lives whole seconds (exp and iat are integers): under one, it is born expired.
    if lifetime < timedelta(seconds=1):
        print(
            f"coordinator token: --lifetime {args.lifetime} is shorter than PT1S, "
            "the least a token can live",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    cap, source = _lifetime_cap(args.config)
    if lifetime > cap:
        print(
            f"coordinator token: --lifetime {args.lifetime} is longer than the cap "
            f"{format_duration(cap)} ({source})",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    existed = args.key.exists()
    try:
        development_key(args.key)
    except (OSError, ValueError) as exc:
        print(f"coordinator token: {exc}", file=sys.stderr)
        return ExitCode.INVALID
    if not existed:
        print(
            f"created development key {args.key}; its JWKS is {jwks_path(args.key)}",
            file=sys.stderr,
        )
    print(
        mint(
            args.key,
            args.client,
            args.scope,
            lifetime.total_seconds(),
            args.issuer or DEVELOPMENT_ISSUER,
            args.audience or DEVELOPMENT_AUDIENCE,
        )
    )
    return ExitCode.OK


def _lifetime_cap(config_file: Path | None) -> tuple[timedelta, str]:
    """The longest token lifetime the service accepts, and where that cap comes from.

    The file is read with the service's own loader (its secrets resolved too), so one
    that ``serve`` would refuse is reported here rather than trusted for its cap.
    """
    from registry_coordinator.config import DEFAULT_MAX_LIFETIME, load_config

    if config_file is None:
        return DEFAULT_MAX_LIFETIME, "the default auth.maxLifetime; no --config given"
    auth = load_config(config_file).auth
    if auth.mode != "jwt":
        return DEFAULT_MAX_LIFETIME, (
            f"the default auth.maxLifetime; {config_file} has auth mode {auth.mode}"
        )
    return auth.max_lifetime, f"auth.maxLifetime in {config_file}"


def _stand_ins(args: argparse.Namespace) -> int:
    import trio

    from registry_coordinator.devtools.standins import (
        IDP,
        PRODUCTS,
        PUSHING,
        Client,
        Tokens,
        Webhook,
        serve_stand_ins,
    )

    names = (*PRODUCTS, IDP)

    def pairs(values: list[str], what: str) -> dict[str, str]:
        found = {}
        for value in values:
            name, _, setting = value.partition("=")
            if name not in names or not setting:
                raise SystemExit(
                    f"coordinator stand-ins: {what} {value!r} is not NAME=VALUE "
                    f"with NAME one of {', '.join(names)}"
                )
            found[name] = setting
        return found

    ports = {name: int(port) for name, port in pairs(args.product, "--product").items()}
    if not ports and args.issuer is None:
        print(
            "coordinator stand-ins: name at least one --product NAME=PORT, or --issuer PORT",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    if (args.issuer is None) != (args.issuer_key is None):
        print(
            "coordinator stand-ins: --issuer PORT and --issuer-key PATH go together",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    if args.issuer is None and (args.audience is not None or args.token_lifetime is not None):
        print(
            "coordinator stand-ins: --audience and --token-lifetime are the issuer's: "
            "add --issuer PORT --issuer-key PATH",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    from registry_coordinator.addresses import require_free

    for name, port in ports.items():
        require_free("127.0.0.1", port, f"--product {name}={port}", "give another port")
    if args.issuer is not None:
        require_free("127.0.0.1", args.issuer, f"--issuer {args.issuer}", "give another port")
    tokens = Tokens(
        os.environ.get("STANDIN_TOKEN", "stand-in-token"),
        os.environ.get("STANDIN_STAFF_TOKEN", "stand-in-staff-token"),
    )
    secret = os.environ.get("STANDIN_WEBHOOK_SECRET", "stand-in-webhook-secret")
    hooks = {}
    for name, url in pairs(args.webhook, "--webhook").items():
        if name not in PUSHING:
            print(
                f"coordinator stand-ins: --webhook {name}={url}: {name} pushes nothing "
                f"(Coordinator reads what it needs); only {', '.join(PUSHING)} pushes",
                file=sys.stderr,
            )
            return ExitCode.USAGE
        hooks[name] = Webhook(url, secret)
    # The IdP's one client, Coordinator: a secret, or a public key to check its JWTs.
    key_file = os.environ.get("STANDIN_CLIENT_PUBLIC_KEY")
    client = Client(
        os.environ.get("STANDIN_CLIENT_ID", "coordinator"),
        None if key_file else os.environ.get("STANDIN_CLIENT_SECRET", "stand-in-client-secret"),
        Path(key_file).read_text() if key_file else None,
        int(os.environ.get("STANDIN_TOKEN_LIFETIME", "3600")),
    )

    issuer = None
    if args.issuer is not None:
        from registry_coordinator.devtools.issuer import TOKEN_LIFETIME, Issuer
        from registry_coordinator.http.auth import DEVELOPMENT_AUDIENCE

        try:
            issuer = Issuer(
                args.issuer,
                args.issuer_key,
                DEVELOPMENT_AUDIENCE if args.audience is None else args.audience,
                TOKEN_LIFETIME if args.token_lifetime is None else args.token_lifetime,
            )
        except (OSError, ValueError) as exc:
            print(f"coordinator stand-ins: {exc}", file=sys.stderr)
            return ExitCode.USAGE

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(
                serve_stand_ins, ports, tokens, hooks, "127.0.0.1", client, args.delivery_delay
            )
            if issuer is not None:
                urls["issuer"] = await nursery.start(issuer.serve)
            for name, url in urls.items():
                print(f"{name} {url}", flush=True)

    _logging()
    try:
        trio.run(run)
    except KeyboardInterrupt:
        return ExitCode.OK
    return ExitCode.OK


def _run_service(main: Callable[[], Awaitable[None]]) -> int:
    """Run a Trio entry point. What escapes Trio's nurseries comes wrapped in exception
    groups, one inside another; an error of the product's own (or Ctrl-C) that came
    alone is taken out of them, so the command reports it as any other: its one line
    and its exit code. Anything else keeps its traceback."""
    import trio

    try:
        trio.run(main)
    except BaseExceptionGroup as group:
        found: BaseException = group
        while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
            found = found.exceptions[0]
        if isinstance(found, CoordinatorError | KeyboardInterrupt):
            raise found from None
        raise
    return ExitCode.OK


def _logging(process: int | None = None) -> None:
    from registry_coordinator.observability.logs import configure

    configure(process)


def _demo(args: argparse.Namespace) -> int:
    from registry_coordinator.devtools.demo import main as demo

    return demo(args.data, args.workflows, args.interactive, args.keep_running)


def _review(args: argparse.Namespace) -> int:
    from registry_coordinator.devtools.reviewer import decide

    token = os.environ.get("STANDIN_STAFF_TOKEN", "stand-in-staff-token")
    decide(args.casework, args.request, args.decision, token, args.outcome)
    print(f"review {args.request}: {args.decision}")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
