"""The configuration's ``tracing:`` section: off by default, an endpoint only where spans
cannot be read on the way, and no endpoint written where nothing would be sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry_coordinator.authoring.diagnostics import Refused
from registry_coordinator.config import TracingConfig, load_config

BASE = "database: {embedded: {dataDirectory: pg}}\nworkflows: []\nauth: {mode: none}\n"


def _write(tmp_path: Path, tracing: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(BASE + tracing)
    return path


def _problems(path: Path) -> list[tuple[str, str, str, int | None]]:
    with pytest.raises(Refused) as caught:
        load_config(path)
    return [(d.code, d.message, d.repair, d.line) for d in caught.value.diagnostics]


def test_tracing_is_off_with_defaults_when_the_section_is_absent(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, ""))
    assert config.tracing == TracingConfig(False, None, "registry-coordinator")


def test_a_valid_tracing_section_is_read_field_by_field(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "tracing:\n"
        "  enabled: true\n"
        "  otlpEndpoint: https://otel.example.org:4318\n"
        "  serviceName: coordinator-eu\n",
    )
    assert load_config(path).tracing == TracingConfig(
        True, "https://otel.example.org:4318", "coordinator-eu"
    )
    path = _write(tmp_path, "tracing: {enabled: true, otlpEndpoint: 'http://127.0.0.1:4318'}\n")
    assert load_config(path).tracing == TracingConfig(
        True, "http://127.0.0.1:4318", "registry-coordinator"
    )
    assert load_config(_write(tmp_path, "tracing: {enabled: true}\n")).tracing.enabled


def test_an_endpoint_in_clear_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "tracing:\n  enabled: true\n  otlpEndpoint: http://otel.example.org\n")
    [(code, message, repair, line)] = _problems(path)
    assert (code, line) == ("config.invalid-value", 6)
    assert message.startswith("tracing otlpEndpoint 'http://otel.example.org' is not an https URL")
    assert "plain http is allowed only to 127.0.0.1, ::1 or localhost" in repair


def test_an_endpoint_whose_port_is_no_port_is_refused(tmp_path: Path) -> None:
    """urlsplit checks a port only when asked: unasked, every export would fail later."""
    path = _write(tmp_path, "tracing:\n  enabled: true\n  otlpEndpoint: http://localhost:99999\n")
    [(code, message, _, line)] = _problems(path)
    assert (code, line) == ("config.invalid-value", 6)
    assert message == (
        "tracing otlpEndpoint 'http://localhost:99999' has a port that is not a number from 0 "
        "to 65535, so no span could be sent"
    )


def test_an_endpoint_while_tracing_is_off_is_refused(tmp_path: Path) -> None:
    for section in (
        "tracing:\n  enabled: false\n  otlpEndpoint: https://otel.example.org\n",
        "tracing:\n  otlpEndpoint: https://otel.example.org\n",
    ):
        [(code, message, repair, line)] = _problems(_write(tmp_path, section))
        assert code == "config.invalid-value"
        assert line == section.count("\n") + 3
        assert message == (
            "tracing otlpEndpoint is given, and tracing is not enabled, so no span would be "
            "sent there"
        )
        assert repair == "set tracing.enabled: true to send spans there, or remove otlpEndpoint"


def test_wrong_types_and_unknown_fields_are_named(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "tracing:\n"
        "  enabled: yes please\n"
        "  serviceName: 7\n"
        "  otlpEndpont: https://otel.example.org\n",
    )
    assert _problems(path) == [
        (
            "field.type",
            "tracing enabled must be true or false, not a string",
            "write enabled: true",
            5,
        ),
        (
            "field.type",
            "tracing field 'serviceName' must be a string, not the number 7",
            'quote it: serviceName: "7"',
            6,
        ),
        ("field.unknown", "tracing has no field 'otlpEndpont'", "did you mean 'otlpEndpoint'?", 7),
    ]
    [(code, message, _, line)] = _problems(_write(tmp_path, "tracing: {serviceName: ' '}\n"))
    assert (code, message, line) == ("config.invalid-value", "tracing serviceName is empty", 4)
    [(code, message, _, line)] = _problems(_write(tmp_path, "tracing: [on]\n"))
    assert (code, message, line) == (
        "field.type",
        "tracing must be a mapping, not a list",
        4,
    )
