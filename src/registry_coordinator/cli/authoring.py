"""The authoring commands: ``check``, ``test``, ``package``, ``digest``, ``graph`` and
``catalog``, all offline.

None of them needs the service, a database or the network: they read workflows, scenarios,
artifacts and the built-in catalog and write to stdout, so they run in CI and on an
author's machine alike. The checker, artifacts and scenarios are imported inside the
commands that use them: the package imports this module for :func:`print_diagnostics`
whatever the command, and the other families' commands do not pay for them. A workflow
that does not check is refused whole (``Refused``: every diagnostic, exit 1); its
warnings are printed and the command goes on.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry_coordinator.authoring.diagnostics import Diagnostic, Refused, Severity, sort_key
from registry_coordinator.authoring.durations import format_duration
from registry_coordinator.errors import ExitCode

if TYPE_CHECKING:
    from registry_coordinator.authoring.artifact import Checked
    from registry_coordinator.authoring.graph import Facts
    from registry_coordinator.cli.tree import Commands, Handler


def add_commands(commands: Commands) -> None:
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


def handlers() -> dict[str, Handler]:
    return {
        "check": _check,
        "test": _test,
        "package": _package,
        "digest": _digest,
        "graph": _graph,
        "catalog": _catalog,
    }


def print_diagnostics(diagnostics: Sequence[Diagnostic]) -> None:
    """Each diagnostic on its line of stderr, in the order of their files and positions."""
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
            print_diagnostics(report.diagnostics)
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
    print_diagnostics([d for d in report.diagnostics if d.severity is Severity.WARNING])
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
