"""The tutorial's commands: ``token``, ``demo`` and ``review``; none of them for production.

``demo`` runs the tutorial end to end; ``token`` and ``review`` are what the tutorial has a
person type (the tests too): a token for a client, and a staff member's decision at the
stand-in Casework. ``token`` mints from a local development key, and never for longer
than the service would accept: the cap of the ``--config`` given, read with the service's
own loader (so a file ``serve`` would refuse is refused here too), or the default cap.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from registry_coordinator.authoring.durations import format_duration
from registry_coordinator.errors import ExitCode

if TYPE_CHECKING:
    from registry_coordinator.cli.tree import Commands, Handler


def add_token_command(commands: Commands) -> None:
    """Tokens from a development key, for the tutorial's clients and the tests'."""
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


def add_commands(commands: Commands) -> None:
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


def handlers() -> dict[str, Handler]:
    return {"token": _token, "demo": _demo, "review": _review}


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


def _demo(args: argparse.Namespace) -> int:
    from registry_coordinator.devtools.demo import main as demo

    return demo(args.data, args.workflows, args.interactive, args.keep_running)


def _review(args: argparse.Namespace) -> int:
    from registry_coordinator.devtools.reviewer import decide

    token = os.environ.get("STANDIN_STAFF_TOKEN", "stand-in-staff-token")
    decide(args.casework, args.request, args.decision, token, args.outcome)
    print(f"review {args.request}: {args.decision}")
    return ExitCode.OK
