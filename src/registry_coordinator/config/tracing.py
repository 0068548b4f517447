"""The ``tracing`` section, read by ``observability.tracing``: whether spans are made and
the OTLP/HTTP collector they go to (https, or plain http to loopback only, since spans
carry run and workflow names).
"""

from __future__ import annotations

from dataclasses import dataclass

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.fields import Reader, describe
from registry_coordinator.authoring.source import DataPath
from registry_coordinator.config.values import (
    https_or_loopback,
    port_valid,
)


@dataclass(frozen=True)
class TracingConfig:
    """Whether spans are made, and where they are sent over OTLP/HTTP (None: nowhere but
    the process; the exporter needs the ``otlp`` extra)."""

    enabled: bool = False
    otlp_endpoint: str | None = None
    service_name: str = "registry-coordinator"


def read_tracing(reader: Reader, value: JSON) -> TracingConfig:
    """Whether spans are made and where they go; an endpoint with tracing off is refused,
    since the operator who wrote it expects traces that would never be sent."""
    path: DataPath = ("tracing",)
    data = reader.mapping(value, path, "tracing") or {}
    reader.fields(data, path, "tracing", [], ["enabled", "otlpEndpoint", "serviceName"])
    enabled = data.get("enabled", False)
    if not isinstance(enabled, bool):
        reader.report(
            "field.type",
            f"tracing enabled must be true or false, not {describe(enabled)}",
            "write enabled: true",
            (*path, "enabled"),
        )
        enabled = False
    endpoint = reader.string(data, "otlpEndpoint", path, "tracing")
    if endpoint is not None and not port_valid(endpoint):
        reader.report(
            "config.invalid-value",
            f"tracing otlpEndpoint {endpoint!r} has a port that is not a number from 0 to "
            "65535, so no span could be sent",
            "give the collector's port, e.g. https://otel.example.org:4318",
            (*path, "otlpEndpoint"),
        )
        endpoint = None
    elif endpoint is not None and not https_or_loopback(endpoint):
        reader.report(
            "config.invalid-value",
            f"tracing otlpEndpoint {endpoint!r} is not an https URL, and spans carry run "
            "and workflow names that must not travel in clear",
            "give the collector's https URL, e.g. https://otel.example.org:4318; plain http "
            "is allowed only to 127.0.0.1, ::1 or localhost",
            (*path, "otlpEndpoint"),
        )
        endpoint = None
    elif endpoint is not None and not enabled:
        reader.report(
            "config.invalid-value",
            "tracing otlpEndpoint is given, and tracing is not enabled, so no span would "
            "be sent there",
            "set tracing.enabled: true to send spans there, or remove otlpEndpoint",
            (*path, "otlpEndpoint"),
        )
    name = reader.string(data, "serviceName", path, "tracing")
    if name is not None and not name.strip():
        reader.report(
            "config.invalid-value",
            "tracing serviceName is empty",
            "give the name traces are grouped by, e.g. serviceName: registry-coordinator",
            (*path, "serviceName"),
        )
        name = None
    return TracingConfig(enabled, endpoint, name or TracingConfig.service_name)
