"""``coordinator keys``: the key-encryption keys personal data's data keys are wrapped
under (docs/custody.md). ``generate`` makes one, written where no file is, readable by
its owner only: a key is never replaced, since what it wraps would be gone with it.
``rotate`` wraps every data key again under the active one while the service runs;
``seal`` seals the runs that ended before custody was configured. Each shows its progress
on a terminal and says what it did in one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from registry_coordinator.errors import CoordinatorError, ExitCode

if TYPE_CHECKING:
    from registry_coordinator.cli.tree import Commands, Handler
    from registry_coordinator.config import Config
    from registry_coordinator.store.database import Database

T = TypeVar("T")
#: Told ``(done, of)`` as a pass goes.
Progress = Callable[[int, int], None]


def add_commands(commands: Commands) -> None:
    """The key-encryption keys of ``custody.keys``."""
    keys = commands.add_parser("keys", help="make the key-encryption keys of custody.keys")
    actions = keys.add_subparsers(dest="keys", required=True, metavar="<keys>")
    new_secret_command(
        actions, "generate", "make a key-encryption key (64 hexadecimal digits) in a new file"
    )
    rotate = actions.add_parser(
        "rotate", help="wrap every data key again under custody.active (the service may run)"
    )
    rotate.add_argument("--config", type=Path, required=True, metavar="FILE")
    sealing = actions.add_parser(
        "seal", help="seal the runs that ended before custody was configured (the service may run)"
    )
    sealing.add_argument("--config", type=Path, required=True, metavar="FILE")


def handlers() -> dict[str, Handler]:
    return {"keys": _keys}


def _keys(args: argparse.Namespace) -> int:
    return {"generate": _generate, "rotate": _rotate, "seal": _seal}[args.keys](args)


def _generate(args: argparse.Namespace) -> int:
    from registry_coordinator.custody import new_kek

    write_new_secret(args.out, (new_kek() + "\n").encode(), "a key-encryption key")
    listed = f'custody: {{keys: {{"N": file:{args.out}}}, active: N}}'
    print(f"wrote a key-encryption key to {args.out}: list it as {listed}")
    return ExitCode.OK


def new_secret_command(actions: Commands, name: str, summary: str) -> None:
    """A command that writes a new secret to ``--out`` (:func:`write_new_secret`)."""
    made = actions.add_parser(name, help=summary)
    made.add_argument("--out", type=Path, required=True, metavar="FILE", help="never replaced")


def _custody_pass(
    args: argparse.Namespace,
    refused: str,
    doing: str,
    work: Callable[[Database, Config, Progress], Awaitable[T]],
    serving: bool = False,
) -> T:
    """One pass of ``work`` over the database of ``--config``, whose custody keys it needs
    (``refused`` says what for, and how to give them), its progress shown on a terminal
    as ``doing: N of M``; what it gives. ``serving``: the database is opened as ``serve``
    opens it, making the shared key if no start has since custody came."""
    from registry_coordinator.cli.service import configure_logging, run_service
    from registry_coordinator.config import load_config
    from registry_coordinator.service import open_database

    config = load_config(args.config)
    if config.custody.active is None:
        raise _KeysUsage(f"{args.config} has no custody keys {refused}")
    done: list[T] = []
    terminal = sys.stderr.isatty()

    def progress(at: int, of: int) -> None:
        if terminal:
            print(f"\r{doing}: {at} of {of}", end="", file=sys.stderr, flush=True)

    async def run() -> None:
        async with open_database(config, "coordinator/keys", serving=serving) as db:
            done.append(await work(db, config, progress))

    configure_logging()
    run_service(run)
    if terminal:
        print(file=sys.stderr)
    return done[0]


def _rotate(args: argparse.Namespace) -> int:
    from registry_coordinator.store import keys

    rotated = _custody_pass(
        args,
        'to rotate to: give custody: {keys: {"1": file:/old, "2": file:/new}, active: 2}',
        "rotating data keys",
        lambda db, config, progress: keys.rotate(db, config.custody, progress),
    )
    others = [v for v in rotated.still if v != rotated.active]
    left = (
        f"data keys are still wrapped under versions {', '.join(map(str, others))}: "
        "run keys rotate again"
        if others
        else "every data key is under it: the other versions may leave custody.keys once "
        "no backup needs them"
    )
    print(
        f"wrapped {keys.counted(rotated.rewrapped)} again under key-encryption key "
        f"{rotated.active} ({rotated.already} already under it, {rotated.erased} erased); "
        f"{left}"
    )
    return ExitCode.OK


def _seal(args: argparse.Namespace) -> int:
    from registry_coordinator.store.sealing_existing import seal_existing

    sealed = _custody_pass(
        args,
        'to seal with: give custody: {keys: {"1": file:/etc/registry-coordinator/kek-1}, '
        "active: 1} (keys generate)",
        "sealing runs",
        lambda db, config, progress: seal_existing(db, progress),
        serving=True,
    )
    live = (
        f"; {sealed.live} written in clear have not ended: run keys seal again once they have"
        if sealed.live
        else "; every run's values are sealed"
    )
    print(
        f"sealed {sealed.runs} ended runs written before custody ({sealed.sendings} sendings) "
        f"under the installation's shared key; their histories stay as written{live}"
    )
    return ExitCode.OK


class _KeysUsage(CoordinatorError):
    exit_code = ExitCode.USAGE


def write_new_secret(path: Path, data: bytes, what: str) -> None:
    """``data`` in a new file at ``path``, readable by its owner only; a file there
    already is never replaced (what it keys would be lost with it)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise _KeysUsage(f"{path} exists, and {what} is never replaced") from None
    except OSError as exc:
        raise _KeysUsage(f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)
