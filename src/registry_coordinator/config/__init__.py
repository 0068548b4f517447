"""The service's configuration: one YAML file, every problem reported at once.

A room per section, each read by one layer above: ``database`` (the store), ``engine``
(``workflows`` and ``engine``: the engine), ``connections`` and ``identity`` (the call
pools, result routes and identities), ``auth`` and ``console`` (the HTTP front end and the
console), ``audit`` (``audit`` and ``retention``), ``tracing`` (observability),
``custody`` (the key-encryption keys: the store); ``file``
reads the whole file and hands each section to its module; ``values`` holds what every
section's fields are made of (secrets by reference, bounded numbers and durations, URLs),
``problems`` what a reading reports. The package sits below the store, so reading a file
never connects or starts anything: ``coordinator token --config`` and ``doctor`` read it
without a database.

Secrets are never values in the file: fields that hold one take ``env:NAME`` or
``file:/path`` and are resolved when the file is read, so a missing secret stops startup
with the field's position. The names below are the package's face; the sections' readers
(``read_*``) are its own.
"""

from __future__ import annotations

from registry_coordinator.config.audit import AuditConfig, RetentionConfig
from registry_coordinator.config.auth import (
    ACTIONS,
    DEFAULT_MAX_LIFETIME,
    MINIMUM_JWKS_REFRESH,
    AuthConfig,
    Policy,
)
from registry_coordinator.config.connections import EXTERNAL, Completions, ConnectionConfig, Rate
from registry_coordinator.config.console import ConsoleConfig
from registry_coordinator.config.custody import CustodyConfig
from registry_coordinator.config.database import DatabaseConfig, has_password
from registry_coordinator.config.engine import EngineConfig, PinnedWorkflow
from registry_coordinator.config.file import (
    Config,
    ConfigReading,
    ListenTls,
    load_config,
    read_config,
)
from registry_coordinator.config.identity import (
    Bearer,
    ClientCredentials,
    Identity,
    TaskAuthority,
)
from registry_coordinator.config.problems import Problems
from registry_coordinator.config.tracing import TracingConfig
from registry_coordinator.config.values import LOOPBACK, https_or_loopback

__all__ = [
    "ACTIONS",
    "DEFAULT_MAX_LIFETIME",
    "EXTERNAL",
    "LOOPBACK",
    "MINIMUM_JWKS_REFRESH",
    "AuditConfig",
    "AuthConfig",
    "Bearer",
    "ClientCredentials",
    "Completions",
    "Config",
    "ConfigReading",
    "ConnectionConfig",
    "ConsoleConfig",
    "CustodyConfig",
    "DatabaseConfig",
    "EngineConfig",
    "Identity",
    "ListenTls",
    "PinnedWorkflow",
    "Policy",
    "Problems",
    "Rate",
    "RetentionConfig",
    "TaskAuthority",
    "TracingConfig",
    "has_password",
    "https_or_loopback",
    "load_config",
    "read_config",
]
