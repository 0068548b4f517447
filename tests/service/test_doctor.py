"""`coordinator doctor`: everything a start needs, one line each, against a real database,
real stand-in products and a real issuer's key set; the exit code says how bad."""

from __future__ import annotations

import json
from pathlib import Path

from registry_coordinator.observability.tracing import OTLP_EXPORTER
from registry_coordinator.store.migrations import known
from tests.support import Services, coordinator

NOTIFY: dict[str, tuple[str, dict[str, str]]] = {"notices": ("messaging", {})}


def test_doctor_says_ok_for_each_thing_a_start_needs(services: Services) -> None:
    service, _ = services.deploy(["notify"], NOTIFY, sign_in=True)
    service.stop()  # its port is free again, as before a start
    result = coordinator("doctor", "--config", service.config)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    # The tests' databases have one role for migrate and serve: said, and not a failure
    # (test_roles.py has the two).
    one_role = [line for line in lines if line.startswith("WARN  serve connects as postgres")]
    assert len(one_role) == 1, lines
    assert all(line.startswith("ok    ") for line in lines if line not in one_role), lines
    said = "\n".join(lines)
    for expected in (
        "configuration ",
        "workflow notify 1: sha256:",
        "every workflow's connections are bound (1 bound)",
        "is free to listen on",
        "database: PostgreSQL 18",
        f"schema: version {known()[-1].version}, this build's",
        "connection notices (messaging, http://127.0.0.1:",
        "connection notices: its identity has a token",
        "auth: 1 keys from ",
        "high-water mark ",
        "custody: 1 data key, all under key-encryption key 1",
    ):
        assert expected in said, (expected, said)
    assert result.stderr.endswith("everything a start needs is in place\n")


def test_doctor_fails_what_is_down_with_3_and_what_is_wrong_with_1(services: Services) -> None:
    service, products = services.deploy(["notify"], NOTIFY)
    products.stop()  # the product is down: unavailable, not wrong
    down = coordinator("doctor", "--config", service.config)  # the service holds its port
    assert down.returncode == 3, down.stdout + down.stderr
    failed = [line for line in down.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 2, down.stdout
    assert "is in use by another process" in failed[0]
    assert failed[1].startswith("FAIL  connection notices (messaging, http://127.0.0.1:")
    assert failed[1].endswith("is it up, is baseUrl right, and is its TLS certificate valid?")
    service.stop()

    settings = json.loads(service.config.read_text())
    settings["workflows"][0]["digest"] = "sha256:" + "0" * 64
    wrong = service.config.with_name("wrong.yaml")
    wrong.write_text(json.dumps(settings))
    refused = coordinator("doctor", "--config", wrong)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert any(
        line.startswith("FAIL  workflows: ") and "digest" in line
        for line in refused.stdout.splitlines()
    ), refused.stdout
    assert "checks failed" in refused.stderr


def test_spans_to_send_without_the_exporter_installed_are_refused_before_anything_starts(
    services: Services, tmp_path: Path
) -> None:
    """The OTLP exporter is an optional extra. Made missing here (a sitecustomize marks its
    module as absent, whatever this environment has installed): doctor fails its check
    with the repair, and `serve` refuses in one line, exit 1, before it reaches the
    database (whose DSN here leads nowhere: reaching it first would exit 3)."""
    config = services.configure(["timed-choice"])
    settings = json.loads(config.read_text())
    settings["tracing"] = {"enabled": True}
    made = config.with_name("made.yaml")
    made.write_text(json.dumps(settings))
    settings["tracing"]["otlpEndpoint"] = "http://127.0.0.1:4318"
    sent = config.with_name("sent.yaml")
    sent.write_text(json.dumps(settings))
    settings["database"] = {"dsn": "postgresql://postgres@/coordinator?host=/nonexistent"}
    nowhere = config.with_name("nowhere.yaml")
    nowhere.write_text(json.dumps(settings))
    (tmp_path / "blocked").mkdir()
    (tmp_path / "blocked" / "sitecustomize.py").write_text(
        f"import sys\nsys.modules[{OTLP_EXPORTER!r}] = None\n"
    )
    without = {"PYTHONPATH": str(tmp_path / "blocked")}

    lines = coordinator("doctor", "--config", made, env=without).stdout.splitlines()
    assert "ok    tracing: spans are made, for logs and products, and sent nowhere" in lines
    doctor = coordinator("doctor", "--config", sent, env=without)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert (
        "FAIL  tracing: spans go to http://127.0.0.1:4318, but the OTLP exporter is not "
        "installed: pip install 'registry-coordinator[otlp]'"
    ) in doctor.stdout.splitlines()
    serve = coordinator("serve", "--config", nowhere, env=without)
    assert serve.returncode == 1, serve.stderr
    [line] = serve.stderr.strip().splitlines()
    assert "pip install 'registry-coordinator[otlp]'" in line, line
