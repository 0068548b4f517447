"""The configuration file: documented example, every problem at once, secrets by reference."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry_coordinator.authoring.diagnostics import Refused
from registry_coordinator.config import ClientCredentials, Rate, TracingConfig, load_config
from registry_coordinator.engine.workflows import load_service
from tests.support import ROOT, coordinator, package, refused


def _pem(key: Ed25519PrivateKey | rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")


def test_the_example_configuration_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COORDINATOR_DATABASE_URL", "postgresql://coordinator@db/coordinator")
    key = Ed25519PrivateKey.generate()
    monkeypatch.setenv("COORDINATOR_AUDIT_KEY", _pem(key))
    for name in ("COORDINATOR_CLIENT_SECRET", "CASEWORK_TOKEN", "MESSAGING_TOKEN"):
        monkeypatch.setenv(name, "a-secret")
    monkeypatch.setenv("CASEWORK_COMPLETION_SECRET", "a-completion-secret")
    kek = "ab" * 32
    monkeypatch.setenv("COORDINATOR_KEK_1", kek)
    config = load_config(ROOT / "config" / "coordinator.example.yaml")
    assert sorted(config.connections) == ["applications", "notices", "reviews"]
    assert {c.product for c in config.connections.values()} == {"breg", "casework", "messaging"}
    # The deployment's own parameters, set per connection, never by a workflow.
    assert {name: c.parameters for name, c in config.connections.items()} == {
        "applications": {"accessProfile": "coordinator"},
        "reviews": {"profile": "coordinator-producer"},
        "notices": {"senderProfile": "case-notices"},
    }
    identity = config.connections["applications"].identity
    assert isinstance(identity, ClientCredentials)
    assert identity.resource == "urn:example:applications"  # RFC 8707, not an audience
    completions = config.connections["reviews"].completions
    assert completions is not None and completions.secret == "a-completion-secret"
    assert config.database.dsn == "postgresql://coordinator@db/coordinator"
    assert config.database.embedded is None
    assert config.engine.workers == 4
    assert config.workflows[0].artifact == ROOT / "artifacts" / "review-application-1.json"
    assert config.audit.signing_key is not None
    assert config.audit.signing_key.public_key() == key.public_key()
    assert config.retention.archive_after == timedelta(days=90)
    assert config.retention.directory == Path("/var/lib/registry-coordinator/archive")
    assert config.tracing == TracingConfig()  # documented, and off
    assert config.custody.active == 1
    assert config.custody.keks[1].secret == bytes.fromhex(kek)


def test_checkpoints_need_an_ed25519_key_and_retention_needs_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOT_ED25519", _pem(rsa.generate_private_key(65537, 2048)))
    path = tmp_path / "config.yaml"
    base = "database: {embedded: {dataDirectory: pg}}\nworkflows: []\nauth: {mode: none}\n"
    path.write_text(base + "audit: {signingKey: env:NOT_ED25519}\n")
    with pytest.raises(Refused) as wrong:
        load_config(path)
    [problem] = wrong.value.diagnostics
    assert problem.message == (
        "audit signingKey cannot sign checkpoints: it is a RSAPrivateKey, not an Ed25519 key"
    )
    assert "openssl genpkey -algorithm ed25519" in problem.repair
    path.write_text(base + "audit: {signingKey: hunter2}\n")
    with pytest.raises(Refused) as literal:
        load_config(path)
    assert [d.code for d in literal.value.diagnostics] == ["config.secret-literal"]
    path.write_text(base + "retention: {archiveAfter: P30D, directory: archive}\n")
    with pytest.raises(Refused) as unsigned:
        load_config(path)
    [problem] = unsigned.value.diagnostics
    assert "audit has no signingKey" in problem.message
    path.write_text(base + "retention: {archiveAfter: P30D}\n")
    with pytest.raises(Refused) as missing:
        load_config(path)
    assert any("directory" in d.message for d in missing.value.diagnostics)


def test_every_problem_is_reported_at_once_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "database:\n"
        "  dsn: postgresql://app:hunter2@db/coordinator\n"
        "  poolSize: 1\n"
        "listen: {port: 99999}\n"
        "workflows:\n"
        "  - artifact: a.json\n"
        "    digest: md5:abc\n"
        "engine:\n"
        "  workers: 0\n"
        "  lease: PT1S\n"
        "  sweepInterval: soon\n"
        "colour: blue\n"
        "auth: {mode: none}\n"
    )
    assert sorted(refused(path), key=lambda p: p[1] or 0) == [
        ("config.secret-literal", 2),
        ("config.invalid-value", 3),
        ("config.invalid-value", 4),
        ("config.invalid-value", 7),
        ("config.invalid-value", 9),
        ("config.invalid-value", 10),
        ("duration.invalid", 11),
        ("field.unknown", 12),
    ]


def test_secrets_come_from_the_environment_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "dsn"
    secret.write_text("postgresql://app:pw@db/coordinator\n")
    path = tmp_path / "config.yaml"
    path.write_text(f"database: {{dsn: 'file:{secret}'}}\nworkflows: []\nauth: {{mode: none}}\n")
    assert load_config(path).database.dsn == "postgresql://app:pw@db/coordinator"
    path.write_text("database: {dsn: 'env:NOT_SET_ANYWHERE'}\nworkflows: []\nauth: {mode: none}\n")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    assert refused(path) == [("config.secret-unavailable", 1)]
    path.write_text("database: {dsn: 'file:/no/such/file'}\nworkflows: []\nauth: {mode: none}\n")
    assert refused(path) == [("config.secret-unavailable", 1)]


def test_a_dsn_whose_port_is_no_port_is_refused_offline_also_by_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq judges a port only as it connects, where its refusal looks like an outage
    (exit 3) and systemd restarts it forever: refused with the file instead, exit 1,
    without the referenced value, which may hold a password."""
    path = tmp_path / "config.yaml"
    for dsn in ("postgresql://app@db:70000/c", "host=a,b port=5432,x dbname=c"):
        path.write_text(f"database: {{dsn: '{dsn}'}}\nworkflows: []\nauth: {{mode: none}}\n")
        assert refused(path) == [("config.invalid-value", 1)], dsn
    monkeypatch.setenv("COORDINATOR_TEST_DSN", "postgresql://app:secret-pw@db:0/c")
    path.write_text(
        "database: {dsn: 'env:COORDINATOR_TEST_DSN'}\nworkflows: []\nauth: {mode: none}\n"
    )
    with pytest.raises(Refused) as caught:
        load_config(path)
    [problem] = caught.value.diagnostics
    assert "env:COORDINATOR_TEST_DSN" in problem.message and "'0'" in problem.message
    assert "secret-pw" not in problem.message
    for dsn in ("postgresql://app@db:5432/c", "postgresql://app@a:1,b:65535/c", "dbname=c"):
        path.write_text(f"database: {{dsn: '{dsn}'}}\nworkflows: []\nauth: {{mode: none}}\n")
        assert load_config(path).database.dsn == dsn


def test_database_needs_exactly_one_of_dsn_and_embedded(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("database: {}\nworkflows: []\nauth: {mode: none}\n")
    assert refused(path) == [("config.invalid-value", 1)]
    path.write_text(
        "database: {dsn: 'env:X', embedded: {dataDirectory: d}}\n"
        "workflows: []\nauth: {mode: none}\n"
    )
    assert refused(path) == [("config.invalid-value", 1)]
    path.write_text("database: {embedded: {dataDirectory: d}}\nworkflows: []\nauth: {mode: none}\n")
    assert load_config(path).database.embedded == tmp_path / "d"


def test_a_pooler_is_declared_with_a_session_dsn_and_never_for_the_embedded_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.yaml"
    tail = "workflows: []\nauth: {mode: none}\n"
    dsn = "dsn: 'postgresql://app@pgbouncer:6432/pooled'"
    session = "sessionDsn: 'postgresql://app@db:5432/c'"
    path.write_text(f"database:\n  {dsn}\n  pooler: transaction\n  {session}\n{tail}")
    database = load_config(path).database
    assert (database.pooler, database.session_dsn) == ("transaction", "postgresql://app@db:5432/c")
    path.write_text(f"database:\n  {dsn}\n{tail}")
    database = load_config(path).database
    assert (database.pooler, database.session_dsn) == ("none", None)
    path.write_text(f"database:\n  {dsn}\n  pooler: transaction\n{tail}")
    assert refused(path) == [("config.invalid-value", 3)]  # no sessionDsn: said at pooler
    path.write_text(f"database:\n  {dsn}\n  pooler: statement\n  {session}\n{tail}")
    assert refused(path) == [("config.invalid-value", 3)]
    path.write_text(f"database:\n  embedded: {{dataDirectory: d}}\n  {session}\n{tail}")
    assert refused(path) == [("config.invalid-value", 3)]


def test_cli_refuses_a_bad_configuration_with_exit_1(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("database: [\n")
    result = coordinator("serve", "--config", path)
    assert result.returncode == 1
    assert "yaml.syntax" in result.stderr
    assert "Traceback" not in result.stderr


def test_reading_the_configuration_loads_no_event_loop_nor_its_database_layer() -> None:
    """``coordinator token --config`` reads the configuration and never connects: it must
    not pay for (nor depend on) trio and the service's database layer."""
    probe = (
        "import sys, registry_coordinator.config as c; "
        "c.has_password('host=db user=app'); "
        "print(sorted(m for m in ('trio', 'registry_coordinator.store.database')"
        " if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_connection_bound_to_no_product_kind_asks_did_you_mean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``product: bregg`` is a typo, not another product: the refusal says which it meant."""
    artifact, digest = package("notify", tmp_path / "artifacts")
    path = tmp_path / "config.yaml"
    path.write_text(
        "database: {embedded: {dataDirectory: pg}}\n"
        f"workflows: [{{artifact: {artifact}, digest: '{digest}'}}]\n"
        "auth: {mode: none}\n"
        "connections:\n"
        "  notices: {product: messagingg, baseUrl: 'http://127.0.0.1:1',"
        " identity: {bearer: env:STANDIN_TOKEN}}\n"
    )
    monkeypatch.setenv("STANDIN_TOKEN", "t")
    with pytest.raises(Refused) as refused:
        load_service(path)
    [problem] = refused.value.diagnostics
    assert (problem.code, problem.line) == ("config.connection-kind", 5)
    assert problem.message == (
        "notify version 1 needs connection 'notices' to be messaging, but it is bound to "
        "'messagingg', which is no product kind"
    )
    assert problem.repair == "did you mean product: messaging?"


def test_a_connections_rate_is_read_with_a_seconds_worth_of_burst_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_TOKEN", "t")
    path = tmp_path / "config.yaml"
    head = "database: {embedded: {dataDirectory: pg}}\nworkflows: []\nauth: {mode: none}\n"

    def connection(rate: str) -> str:
        return (
            "connections:\n"
            "  notices: {product: messaging, baseUrl: 'http://127.0.0.1:1',"
            f" identity: {{bearer: env:STANDIN_TOKEN}}, rate: {rate}}}\n"
        )

    path.write_text(head + connection("{perSecond: 40}"))
    assert load_config(path).connections["notices"].rate == Rate(40, 40)
    path.write_text(head + connection("{perSecond: 40, burst: 5}"))
    assert load_config(path).connections["notices"].rate == Rate(40, 5)
    path.write_text(head + connection("{perSecond: 0, bursts: 5}"))
    assert sorted(refused(path)) == [("config.invalid-value", 5), ("field.unknown", 5)]
    path.write_text(head + connection("{burst: 5}"))
    assert [code for code, _ in refused(path)] == ["field.missing"]
