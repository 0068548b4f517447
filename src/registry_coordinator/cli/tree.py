"""The command tree: every ``coordinator`` command, in the order ``--help`` lists them, and
the handler that runs each.

Each family of commands is a module of this package that adds its commands' parsers and
names their handlers side by side, so a command is added in one place; this module only
puts the families together. Every parser in the tree is a :class:`_Parser`, so a usage
error anywhere exits 2 (``ExitCode.USAGE``) with the usage of the command it is in.
``tests/offline/test_command_tree.py`` holds the whole tree written out: an option added,
removed or made required changes that test too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn, TypeAlias

from registry_coordinator import __version__
from registry_coordinator.cli import (
    audit,
    authoring,
    keys,
    remote,
    service,
    standins,
    tutorial,
)
from registry_coordinator.errors import ExitCode

#: Runs one command with its parsed arguments; what it returns is the exit code.
Handler: TypeAlias = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own exit code is already 2
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message}\n")


#: Where a family adds its commands.
Commands: TypeAlias = "argparse._SubParsersAction[_Parser]"


def parser() -> argparse.ArgumentParser:
    """The whole command line, every family's commands under ``coordinator``."""
    # httpx imports its own command line (click, rich and pygments: a tenth of a second of
    # every start) whenever they are installed, as the test tools install them; nothing
    # here uses it, so it is kept out before any command brings httpx in.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

    top = _Parser(prog="coordinator", description="Registry Coordinator: durable workflows")
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    authoring.add_commands(commands)
    service.add_commands(commands)
    standins.add_commands(commands)
    tutorial.add_token_command(commands)
    audit.add_commands(commands)
    keys.add_commands(commands)
    remote.add_commands(commands)
    tutorial.add_commands(commands)
    return top


def handler(command: str) -> Handler:
    """What runs ``command``, one of the commands :func:`parser` accepts."""
    handlers = {
        **authoring.handlers(),
        **service.handlers(),
        **standins.handlers(),
        **tutorial.handlers(),
        **audit.handlers(),
        **keys.handlers(),
        **remote.handlers(),
    }
    return handlers[command]
