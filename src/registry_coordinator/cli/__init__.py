"""The ``coordinator`` command line: :func:`main`, and one module per family of commands.

Exit codes everywhere (``errors.ExitCode``): 0 ok, 1 refused or invalid, 2 usage,
3 unavailable, 130 stopped by Ctrl-C. User mistakes are reported as diagnostics, never
as tracebacks: an error of the product's own (``errors.CoordinatorError``) that reaches
:func:`main` is printed as its one line (a refusal as its diagnostics) and ends the
command with its exit code.

:mod:`.tree` puts the command tree together from the families, a module each:
:mod:`.authoring` (the offline commands on workflows), :mod:`.service` (running the
service and migrating its schema), :mod:`.audit`, :mod:`.remote` (the operators' commands
to a running service, over HTTP), :mod:`.standins` and :mod:`.tutorial` (trying
Coordinator on one machine). Each family imports what its commands need inside them: the
service's modules (Trio, psycopg, Quart) only in the commands that run it, so the offline
authoring commands start quickly; the authoring modules (the checker, artifacts,
scenarios) only in the commands that read workflows, so the remote, token and audit
commands start quickly too; and httpx only in the commands that speak HTTP. Importing the
package imports nothing of the product's beyond ``authoring.diagnostics`` and
``authoring.durations``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from registry_coordinator.authoring.diagnostics import Refused
from registry_coordinator.cli.authoring import print_diagnostics
from registry_coordinator.cli.tree import handler, parser
from registry_coordinator.errors import CoordinatorError, ExitCode

__all__ = ["main", "parser"]


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    command = handler(args.command)
    try:
        code = command(args)
        sys.stdout.flush()  # a pipe closed early fails here, if not before
        return code
    except BrokenPipeError:
        # Whoever reads stdout stopped (`| head`, `| grep -q`): that ends the command,
        # quietly and as a success, and Python's own flush at exit must not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK
    except Refused as refused:  # every reason, each on its line with its position
        print_diagnostics(refused.diagnostics)
        return refused.exit_code
    except CoordinatorError as error:
        print(f"coordinator: {error.line()}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
