"""``coordinator stand-ins``: stand-in Registry Stack products and a stand-in OpenID
Connect issuer, served on this machine for the demo, the tutorial and the tests; never for
production.

Everything is served on loopback only, each stand-in on the port it is given, and a port
already taken is refused before anything starts. What the stand-ins need besides the
command line (the tokens they accept, the webhook secret, the token endpoint's client)
comes from ``STANDIN_*`` environment variables, with the defaults the demo and the tests
use. Each one's URL is printed on a line of its own once it is ready, so whoever started
the command reads from its stdout when to go on.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from registry_coordinator.cli.service import configure_logging
from registry_coordinator.errors import ExitCode

if TYPE_CHECKING:
    from registry_coordinator.cli.tree import Commands, Handler
    from registry_coordinator.devtools.issuer import StandInIssuer
    from registry_coordinator.devtools.standins import Client, Tokens, Webhook


def add_commands(commands: Commands) -> None:
    """Serving the stand-in products, their token endpoint and an issuer."""
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


def handlers() -> dict[str, Handler]:
    return {"stand-ins": _stand_ins}


class _Unusable(Exception):
    """What ``coordinator stand-ins`` was given and cannot use: its one line, exit 2."""


def _stand_ins(args: argparse.Namespace) -> int:
    """Serve the stand-ins named until Ctrl-C, printing each one's URL on a line of its own
    as it is ready, for whoever started them to read."""
    import trio

    from registry_coordinator.devtools.standins import Tokens

    try:
        ports = _ports(args)
        hooks = _webhooks(args.webhook)
        client = _idp_client()
        issuer = _issuer(args)
    except _Unusable as unusable:
        print(f"coordinator stand-ins: {unusable}", file=sys.stderr)
        return ExitCode.USAGE
    tokens = Tokens(
        os.environ.get("STANDIN_TOKEN", "stand-in-token"),
        os.environ.get("STANDIN_STAFF_TOKEN", "stand-in-staff-token"),
    )
    configure_logging()
    try:
        trio.run(_serve_stand_ins, ports, tokens, hooks, client, issuer, args.delivery_delay)
    except KeyboardInterrupt:
        return ExitCode.OK
    return ExitCode.OK


def _named(values: list[str], what: str) -> dict[str, str]:
    """``NAME=VALUE`` options by their names, each a stand-in's; one that is not ends the
    command (exit 1)."""
    from registry_coordinator.devtools.standins import IDP, PRODUCTS

    names = (*PRODUCTS, IDP)
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


def _ports(args: argparse.Namespace) -> dict[str, int]:
    """The products' ports, once the options are known to go together, each free (and the
    issuer's)."""
    from registry_coordinator.addresses import require_free

    ports = {name: int(port) for name, port in _named(args.product, "--product").items()}
    if not ports and args.issuer is None:
        raise _Unusable("name at least one --product NAME=PORT, or --issuer PORT")
    if (args.issuer is None) != (args.issuer_key is None):
        raise _Unusable("--issuer PORT and --issuer-key PATH go together")
    if args.issuer is None and (args.audience is not None or args.token_lifetime is not None):
        raise _Unusable(
            "--audience and --token-lifetime are the issuer's: add --issuer PORT --issuer-key PATH"
        )
    for name, port in ports.items():
        require_free("127.0.0.1", port, f"--product {name}={port}", "give another port")
    if args.issuer is not None:
        require_free("127.0.0.1", args.issuer, f"--issuer {args.issuer}", "give another port")
    return ports


def _webhooks(values: list[str]) -> dict[str, Webhook]:
    """Where each product that pushes pushes what it completes, signed with the secret."""
    from registry_coordinator.devtools.standins import PUSHING, Webhook

    secret = os.environ.get("STANDIN_WEBHOOK_SECRET", "stand-in-webhook-secret")
    hooks = {}
    for name, url in _named(values, "--webhook").items():
        if name not in PUSHING:
            raise _Unusable(
                f"--webhook {name}={url}: {name} pushes nothing "
                f"(Coordinator reads what it needs); only {', '.join(PUSHING)} pushes"
            )
        hooks[name] = Webhook(url, secret)
    return hooks


def _idp_client() -> Client:
    """The token endpoint's one client, Coordinator: a secret, or a public key to check
    its JWTs."""
    from registry_coordinator.devtools.standins import Client

    key_file = os.environ.get("STANDIN_CLIENT_PUBLIC_KEY")
    return Client(
        os.environ.get("STANDIN_CLIENT_ID", "coordinator"),
        None if key_file else os.environ.get("STANDIN_CLIENT_SECRET", "stand-in-client-secret"),
        Path(key_file).read_text() if key_file else None,
        int(os.environ.get("STANDIN_TOKEN_LIFETIME", "3600")),
    )


def _issuer(args: argparse.Namespace) -> StandInIssuer | None:
    """The stand-in OpenID Connect issuer, if one was asked for."""
    if args.issuer is None:
        return None
    from registry_coordinator.devtools.issuer import TOKEN_LIFETIME, StandInIssuer
    from registry_coordinator.http.auth import DEVELOPMENT_AUDIENCE

    try:
        return StandInIssuer(
            args.issuer,
            args.issuer_key,
            DEVELOPMENT_AUDIENCE if args.audience is None else args.audience,
            TOKEN_LIFETIME if args.token_lifetime is None else args.token_lifetime,
        )
    except (OSError, ValueError) as exc:
        raise _Unusable(str(exc)) from None


async def _serve_stand_ins(
    ports: dict[str, int],
    tokens: Tokens,
    hooks: dict[str, Webhook],
    client: Client,
    issuer: StandInIssuer | None,
    delivery_delay: float,
) -> None:
    import trio

    from registry_coordinator.devtools.standins import serve_stand_ins

    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            serve_stand_ins, ports, tokens, hooks, "127.0.0.1", client, delivery_delay
        )
        if issuer is not None:
            urls["issuer"] = await nursery.start(issuer.serve)
        for name, url in urls.items():
            print(f"{name} {url}", flush=True)
