"""``coordinator keys``: the key-encryption keys personal data's data keys are wrapped
under (docs/custody.md). ``generate`` makes one, written where no file is, readable by
its owner only: a key is never replaced, since what it wraps would be gone with it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from registry_coordinator.errors import CoordinatorError, ExitCode

if TYPE_CHECKING:
    from registry_coordinator.cli.tree import Commands, Handler


def add_commands(commands: Commands) -> None:
    """The key-encryption keys of ``custody.keys``."""
    keys = commands.add_parser("keys", help="make the key-encryption keys of custody.keys")
    actions = keys.add_subparsers(dest="keys", required=True, metavar="<keys>")
    new_secret_command(
        actions, "generate", "make a key-encryption key (64 hexadecimal digits) in a new file"
    )


def handlers() -> dict[str, Handler]:
    return {"keys": _keys}


def _keys(args: argparse.Namespace) -> int:
    from registry_coordinator.custody import new_kek

    write_new_secret(args.out, (new_kek() + "\n").encode(), "a key-encryption key")
    listed = f'custody: {{keys: {{"N": file:{args.out}}}, active: N}}'
    print(f"wrote a key-encryption key to {args.out}: list it as {listed}")
    return ExitCode.OK


def new_secret_command(actions: Commands, name: str, summary: str) -> None:
    """A command that writes a new secret to ``--out`` (:func:`write_new_secret`)."""
    made = actions.add_parser(name, help=summary)
    made.add_argument("--out", type=Path, required=True, metavar="FILE", help="never replaced")


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
