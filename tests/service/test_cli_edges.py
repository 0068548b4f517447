"""The command line at its edges, as a user meets them: a port already taken, a pipe
closed early, a service URL that is not one. Each ends in one line and its exit code."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.support import ROOT, WORKFLOWS, Services, coordinator, process_env


def _taken() -> socket.socket:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    return busy


def test_serve_on_a_busy_port_says_so_in_one_line_before_anything_starts(
    services: Services,
) -> None:
    with _taken() as busy:
        port = busy.getsockname()[1]
        config = services.configure(["chain"], port=port)
        result = coordinator("serve", "--config", config)
    assert result.returncode == 3, result.stderr
    [line] = result.stderr.strip().splitlines()  # no PostgreSQL, no migrations, no traceback
    assert line == (
        f"coordinator: 127.0.0.1:{port} is in use by another process (listen.host, listen.port "
        f"in {config}): stop it, or give listen.port another port"
    )


def test_stand_ins_on_a_busy_port_say_so_in_one_line() -> None:
    with _taken() as busy:
        port = busy.getsockname()[1]
        result = coordinator("stand-ins", "--product", "casework=0", "--product", f"breg={port}")
    assert result.returncode == 3, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line == (
        f"coordinator: 127.0.0.1:{port} is in use by another process (--product breg={port}): "
        "stop it, or give another port"
    )


def test_a_pipe_closed_early_ends_the_command_quietly() -> None:
    """As `coordinator ... | grep -q x` closes its end at the first match: no traceback,
    and exit 0, so a pipeline under `set -o pipefail` is judged by grep."""
    process = subprocess.Popen(
        [sys.executable, "-m", "registry_coordinator", "graph", WORKFLOWS / "review-application"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=process_env(),
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before it writes a byte
    errors = process.stderr.read().decode()
    process.stderr.close()
    assert process.wait(60) == 0, errors
    assert errors == ""


def test_a_service_url_that_is_not_one_is_a_usage_error() -> None:
    for url in ("notaurl", "ftp://127.0.0.1:1", "http://"):
        result = coordinator("runs", "list", "--url", url)
        assert result.returncode == 2, (url, result.stderr)
        [line] = result.stderr.strip().splitlines()
        assert line == (
            f"coordinator: --url {url!r} is not the service's http or https URL, "
            "e.g. http://127.0.0.1:8080"
        )
