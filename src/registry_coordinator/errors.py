"""The root of every error the product raises on purpose, and the command line's exit codes.

An error a user can act on (a refused workflow, an unreachable database, a schema this
build does not run) is a :class:`CoordinatorError`: it carries the exit code the command
line ends with, and its text (after its class's :attr:`~CoordinatorError.summary`, if it
has one) is the one line the command prints. Anything else that escapes is a defect and
keeps its traceback. The codes are part of the contract
(README, "Exit codes"): scripts and supervisors branch on them.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class ExitCode(IntEnum):
    """How a ``coordinator`` command ended."""

    OK = 0
    #: What was given is refused: a workflow, a configuration, a schema, a command's answer.
    INVALID = 1
    #: The command line itself is wrong: an unknown option, a malformed argument.
    USAGE = 2
    #: Something the command needs cannot be reached now: the database, the service.
    UNAVAILABLE = 3
    #: Stopped by Ctrl-C (128 + SIGINT), as shells report it.
    INTERRUPTED = 130


class CoordinatorError(Exception):
    """An error the product raises on purpose; its text says what to do."""

    exit_code: ClassVar[ExitCode] = ExitCode.INVALID
    #: What kind of trouble it is, in the few words the command line says before the
    #: message where the message alone would not say it ("database unavailable", before
    #: a driver's "connection refused"); empty where the message says it all.
    summary: ClassVar[str] = ""

    def line(self) -> str:
        """The error as the command line prints it, after ``coordinator:``."""
        return f"{self.summary}: {self}" if self.summary else str(self)
