"""Coordinator as separate processes, as a user runs it: one-off commands, ``coordinator
migrate``, and ``coordinator serve`` (:class:`Service`) with an HTTP client for it, all
with the tests' secrets in their environment and their stderr in a log file."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support.paths import ROOT
from tests.support.tokens import STAFF_TOKEN, STANDIN_TOKEN, WEBHOOK_SECRET


def python_env() -> dict[str, str]:
    """This environment, for the Python processes a test starts, except that they may write
    bytecode where it says not to (PYTHONDONTWRITEBYTECODE): the suite starts hundreds of
    them, and each would compile the package anew (0.1-0.2 s of CPU)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def process_env(**extra: str) -> dict[str, str]:
    """The environment service and stand-in processes run with: the tests' secrets."""
    settings = {
        "STANDIN_TOKEN": STANDIN_TOKEN,
        "STANDIN_STAFF_TOKEN": STAFF_TOKEN,
        "STANDIN_WEBHOOK_SECRET": WEBHOOK_SECRET,
    }
    return {**python_env(), **settings, **extra}


def coordinator(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``coordinator`` as a separate process, as a user would (``env``: more of its
    environment)."""
    return subprocess.run(
        [sys.executable, "-m", "registry_coordinator", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=120,
        check=False,
        env=process_env(**(env or {})),
    )


def coordinator_on_terminal(*args: str | Path) -> tuple[int, str, str]:
    """Run ``coordinator`` with its stderr on a terminal (a pseudo-terminal), as a person at
    one runs a long command: its exit code, its stdout, and what the terminal showed."""
    leader, follower = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "registry_coordinator", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=follower,
        cwd=ROOT,
        env=process_env(),
    ) as child:
        os.close(follower)
        shown = bytearray()
        while select.select([leader], [], [], 120)[0]:  # a child that hangs fails the wait
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child is gone and the terminal closed
                break
            if not chunk:
                break
            shown += chunk
        out = child.stdout.read() if child.stdout else b""
        code = child.wait(120)
    os.close(leader)
    return code, out.decode(), shown.decode()


def coordinator_process(
    args: list[str], log: Path, env: dict[str, str] | None = None, stdout: Any = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    """``coordinator ARGS`` started, its stderr appended to ``log``. The child owns the log:
    this process closes its own handle on it once the child has started."""
    with log.open("ab") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "registry_coordinator", *args],
            stdout=stdout,
            stderr=stderr,
            env=process_env(**(env or {})),
            cwd=ROOT,
        )


def migrate(config: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "registry_coordinator", "migrate", "--config", str(config)],
        capture_output=True,
        text=True,
        check=False,
        env=process_env(),
    )
    assert result.returncode == 0, result.stderr


class Service:
    """A ``coordinator serve`` process and an HTTP client for it."""

    def __init__(
        self,
        config: Path,
        log: Path,
        crash_at: str | None = None,
        env: dict[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        """``args``: more of ``serve``'s options (``--processes N``)."""
        self.config = config
        self.log = log
        port = json.loads(config.read_text())["listen"]["port"]
        self.url = f"http://127.0.0.1:{port}"
        environment = {"COORDINATOR_CRASH_AT": crash_at or "", **(env or {})}
        self._mark = log.stat().st_size if log.exists() else 0
        self.process = coordinator_process(
            ["serve", "--config", str(config), *args], log, environment
        )
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def wait_listening(self, timeout: float = 30) -> Service:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_bytes()[self._mark :].decode(errors="replace")
            if "listening on" in text:
                return self
            if self.process.poll() is not None:
                raise AssertionError(f"the service exited {self.process.returncode}:\n{text}")
            time.sleep(0.05)
        raise AssertionError(f"the service did not start:\n{self.log.read_text()}")

    def start_run(self, workflow: str, run_input: Any, key: str | None = None) -> str:
        response = self.http.post(
            "/v1/runs",
            json={"workflow": workflow, "input": run_input},
            headers={"Idempotency-Key": key or uuid.uuid4().hex},
        )
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def status(self, run_id: str) -> dict[str, Any]:
        response = self.http.get(f"/v1/runs/{run_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def history(self, run_id: str) -> list[dict[str, Any]]:
        response = self.http.get(f"/v1/runs/{run_id}/history")
        assert response.status_code == 200, response.text
        return list(response.json()["events"])

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.http.close()

    def stop(self) -> int:
        """SIGTERM and wait: the graceful path."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                raise
        self.http.close()
        return self.process.returncode


@contextmanager
def running(config: Path, log: Path, crash_at: str | None = None) -> Iterator[Service]:
    service = Service(config, log, crash_at).wait_listening()
    try:
        yield service
    finally:
        if service.process.poll() is None:
            service.stop()
        service.http.close()  # also when the process ended by itself (a crash point)
