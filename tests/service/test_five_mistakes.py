"""Five mistakes in one configuration, each reported in the same pass, one line each with
the path in the file and its repair: by `doctor`, and by `serve` as it refuses to start.

The mistakes are an operator's usual ones, of every stage a start looks at: the file
(a webhook secret's file missing), the artifacts (a digest off by one digit), the bindings
(a workflow's connection left unbound), and what the file points at (a database port
nothing listens on, a listen port another process holds).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Services, coordinator
from tests.support.network import free_port


@pytest.fixture
def five_mistakes(services: Services, tmp_path: Path) -> Iterator[Path]:
    """A configuration with the five mistakes, its listen port held while the test runs;
    the product it still binds is up (a Casework stand-in), so it is no sixth."""
    bound: dict[str, tuple[str, dict[str, str]]] = {
        "reviews": ("casework", {}),
        "notices": ("messaging", {}),
    }
    service, _ = services.deploy(["two-mutations"], bound)
    service.stop()  # the stand-in stays up; its configuration is the one to break
    settings = json.loads(service.config.read_text())
    missing = tmp_path / "casework-webhook-secret"
    settings["connections"]["reviews"]["completions"] = {"secret": f"file:{missing}"}
    del settings["connections"]["notices"]  # two-mutations calls it: now unbound
    settings["database"]["dsn"] = f"postgresql://postgres@127.0.0.1:{free_port()}/coordinator"
    pin = settings["workflows"][0]
    pin["digest"] = pin["digest"][:-1] + ("1" if pin["digest"][-1] == "0" else "0")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        settings["listen"]["port"] = busy.getsockname()[1]
        config = service.config.with_name("five-mistakes.yaml")
        config.write_text(json.dumps(settings, indent=2))
        yield config


EXPECTED = (  # what each line names: the field, and the words of its repair
    ("webhook secret", "completions secret", "create the file"),
    ("digest", "config.digest-mismatch", "pin the digest"),
    ("unbound connection", "'notices'", "add connections"),
    ("database", "database", "correct database.dsn"),
    ("listen port", "listen.port", "give listen.port another port"),
)


def test_doctor_reports_all_five_in_one_pass(five_mistakes: Path) -> None:
    result = coordinator("doctor", "--config", five_mistakes)
    assert result.returncode == 1, result.stdout + result.stderr  # refusals outrank outages
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 5, result.stdout
    for what, field, repair in EXPECTED:
        [line] = [line for line in failed if field in line]  # one line each
        assert repair in line, (what, line)
    garbled = [line for line in failed if line.count("stop") > 1 or "or another port:" in line]
    assert not garbled, garbled
    assert result.stderr.strip().startswith("5 of "), result.stderr  # the rest are ok


def test_serve_refuses_with_all_five_at_once(five_mistakes: Path) -> None:
    result = coordinator("serve", "--config", five_mistakes)
    assert result.returncode == 1, result.stderr
    said = result.stderr
    problems = [line for line in said.splitlines() if not line.startswith("  repair: ")]
    assert len(problems) == 5, said
    for what, field, repair in EXPECTED:
        [line] = [line for line in problems if field in line]
        assert f"{five_mistakes}:" in line, (what, line)  # where in the file
        assert repair in said, (what, said)
    assert "Traceback" not in said
