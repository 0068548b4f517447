"""The operators' commands to a running service: ``coordinator runs ...``,
``coordinator admission ...``, ``coordinator connections ...``, ``coordinator bulk ...``,
``coordinator approvals ...`` and ``coordinator erase``, their arguments;
:mod:`registry_coordinator.http.remote` sends them and says what came back.

Every remote command takes the same three options (where the service is, the file holding
the bearer token, and text or JSON), each defaulting to an environment variable where an
operator sets it once; nothing here imports httpx, so the other commands never pay for it.
Exit codes are the client's: 0 done, 1 refused by the service, 2 usage, 3 unavailable.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from registry_coordinator.cli.tree import Commands, Handler

DEFAULT_URL = "http://127.0.0.1:8080"


def add_commands(commands: Commands) -> None:
    """The ``runs``, ``admission``, ``connections``, ``bulk``, ``approvals`` and ``erase``
    commands, with their common options."""
    runs = commands.add_parser("runs", help="start, list, inspect and act on runs")
    common = type(runs)(add_help=False)  # a parent only: each command copies its options
    common.add_argument(
        "--url",
        default=os.environ.get("COORDINATOR_URL", DEFAULT_URL),
        help="the service (default $COORDINATOR_URL or %(default)s)",
    )
    common.add_argument(
        "--token-file",
        type=Path,
        default=os.environ.get("COORDINATOR_TOKEN_FILE"),
        help="a file holding the bearer token (default $COORDINATOR_TOKEN_FILE)",
    )
    common.add_argument("--format", choices=["text", "json"], default="text")

    actions = runs.add_subparsers(dest="action", required=True, parser_class=type(runs))
    start = actions.add_parser("start", parents=[common], help="start a run")
    start.add_argument("workflow")
    start.add_argument("--input", required=True, metavar="JSON|@FILE")
    start.add_argument("--version")
    start.add_argument("--key", help="the Idempotency-Key (default: a new one, printed)")
    listing = actions.add_parser("list", parents=[common], help="list runs, newest first")
    listing.add_argument("--state")
    listing.add_argument("--workflow")
    listing.add_argument(
        "--field",
        action="append",
        metavar="NAME:VALUE",
        help="runs whose search field NAME is exactly VALUE (repeat: every one)",
    )
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--cursor")
    listing.add_argument(
        "--archived", action="store_true", help="the runs retention archived, with their bundles"
    )
    for name, what in (("status", "a run's status"), ("history", "a run's history")):
        action = actions.add_parser(name, parents=[common], help=what)
        action.add_argument("run")
    for name, what in (
        ("cancel", "cancel a run"),
        ("retry-same", "resend a held run's sealed request"),
        ("reconcile", "complete a held call from the product's receipt"),
    ):
        action = actions.add_parser(name, parents=[common], help=what)
        action.add_argument("run")
        action.add_argument("--reason", required=True)
        if name == "retry-same":
            action.add_argument(
                "--attestation",
                metavar="TEXT",
                help="what you found at the product: needed to release a run held restored-review",
            )
            action.add_argument(
                "--binding",
                choices=["sealed", "current"],
                help="where the resend goes when its connection changed since the request "
                "was sealed: where it was sealed to, or the connection as it is now",
            )

    admission = commands.add_parser("admission", help="hold or release new starts")
    changes = admission.add_subparsers(dest="action", required=True, parser_class=type(admission))
    for name in ("hold", "release"):
        change = changes.add_parser(name, parents=[common], help=f"{name} admission")
        change.add_argument("--reason", required=True)
        change.add_argument("--workflow", help=f"{name} the starts of this workflow only")

    connections = commands.add_parser(
        "connections", help="list connections; pause or resume one for its product's maintenance"
    )
    verbs = connections.add_subparsers(dest="action", required=True, parser_class=type(runs))
    verbs.add_parser("list", parents=[common], help="each connection, and its pause if paused")
    _with_reason(
        verbs,
        common,
        "connection",
        ("pause", "send no call over a connection until it is resumed (runs wait)"),
        ("resume", "resume a connection: the runs that waited go on"),
    )

    bulk = commands.add_parser(
        "bulk", help="one action on every run a filter finds, as a durable job (operators)"
    )
    jobs = bulk.add_subparsers(dest="action", required=True, parser_class=type(runs))
    preview = jobs.add_parser(
        "preview", parents=[common], help="find the runs a job would take: nothing is done"
    )
    preview.add_argument(
        "--action",
        dest="action_name",  # "action" names the subcommand
        required=True,
        choices=["cancel", "retry-same", "reconcile"],
    )
    preview.add_argument("--workflow")
    preview.add_argument("--version")
    preview.add_argument("--state")
    preview.add_argument("--hold-code")
    preview.add_argument("--connection", help="runs at a call over this connection")
    preview.add_argument("--admitted-after", metavar="INSTANT")
    preview.add_argument("--admitted-before", metavar="INSTANT")
    preview.add_argument("--field", action="append", metavar="NAME:VALUE")
    preview.add_argument("--per-second", type=int, help="the rate it takes runs at (default 5)")
    jobs.add_parser("list", parents=[common], help="the latest jobs")
    show = jobs.add_parser("show", parents=[common], help="a job's progress and changes")
    show.add_argument("job")
    _with_reason(
        jobs,
        common,
        "job",
        ("start", "start a previewed job: each run's history is given the reason"),
        ("pause", "take no more runs until it is resumed"),
        ("resume", "go on taking runs"),
        ("cancel", "take no more runs, ever"),
    )

    approvals = commands.add_parser(
        "approvals", help="actions waiting for a second operator (fourEyes connections)"
    )
    asks = approvals.add_subparsers(dest="action", required=True, parser_class=type(runs))
    asks.add_parser("list", parents=[common], help="the actions waiting, the oldest first")
    _with_reason(
        asks,
        common,
        "approval",
        ("approve", "take the action another operator asked for"),
        ("reject", "take nothing: the run stays as it is"),
    )

    erase = commands.add_parser(
        "erase",
        parents=[common],
        help="erase one data subject's personal data, in every run and bundle (operators)",
    )
    erase.add_argument("--subject", required=True, help="the id the workflow's subject gives")
    erase.add_argument("--reason", required=True)


def _with_reason(
    verbs: Any,
    common: argparse.ArgumentParser,
    target: str,
    *named: tuple[str, str],
) -> None:
    """A command for each ``(name, help)`` of ``named`` that changes one ``target`` (its
    positional argument) and records why (``--reason``, required)."""
    for name, what in named:
        verb = verbs.add_parser(name, parents=[common], help=what)
        verb.add_argument(target)
        verb.add_argument("--reason", required=True)


def handlers() -> dict[str, Handler]:
    return {
        "runs": _remote,
        "admission": _remote,
        "connections": _remote,
        "bulk": _remote,
        "approvals": _remote,
        "erase": _remote,
    }


def _remote(args: argparse.Namespace) -> int:
    from registry_coordinator.http import remote

    return remote.run(args)
