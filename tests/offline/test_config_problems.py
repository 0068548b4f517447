"""Every problem a configuration has, reported in one go: its structure, the pinned
artifacts and the connections they are bound to, as far as the structure lets each be
looked at, so that an operator is not sent round once per stage."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from registry_coordinator.authoring.diagnostics import Diagnostic, Position, Refused
from registry_coordinator.authoring.source import load_yaml
from registry_coordinator.config import Problems, read_config
from registry_coordinator.engine.workflows import load_service, read_service
from tests.support import coordinator, package

ZERO = "sha256:" + "0" * 64


def test_the_collector_keeps_every_stage_in_order_with_positions() -> None:
    _, source = load_yaml(
        b"workflows:\n  - artifact: a.json\nconnections:\n  x: {product: p}\n", "c"
    )
    problems = Problems(source)
    problems.refuse()  # nothing found: nothing raised
    assert not problems
    problems.report(
        "connections", "config.connection-kind", "bound wrong", "rebind", ("connections", "x")
    )
    stray = Diagnostic("artifact.invalid", "not JSON", "repackage", "a.json")
    problems.add("workflows", [stray])
    problems.report("configuration", "field.unknown", "no such field", "remove it", ("nowhere",))
    assert [d.message for d in problems.all()] == ["no such field", "not JSON", "bound wrong"]
    assert [d.message for d in problems.of("workflows")] == ["not JSON"]
    assert problems.all()[2].position == Position(4, 3)  # a flow mapping: its key
    assert problems.all()[2].file == "c"
    assert problems.all()[0].position == Position(1, 1)  # an absent path: the nearest ancestor
    with pytest.raises(Refused) as refused:
        problems.refuse()
    assert refused.value.diagnostics == tuple(problems.all())


class Bad(NamedTuple):
    config: Path
    missing: Path
    act: Path
    notify: Path
    act_digest: str
    notify_digest: str


def _bad_everywhere(tmp_path: Path) -> Bad:
    """A configuration with a problem at every stage: an unknown field and a broken auth
    section, a pinned artifact that is not there, a workflow's connection bound to a
    misspelt product kind, another it needs that is absent, and an unused connection
    whose product kind is misspelt too."""
    act, act_digest = package("act", tmp_path / "artifacts")
    notify, notify_digest = package("notify", tmp_path / "artifacts")
    missing = tmp_path / "artifacts" / "gone-1.json"
    path = tmp_path / "config.yaml"
    path.write_text(
        "database: {embedded: {dataDirectory: pg}}\n"
        "workflows:\n"
        f"  - {{artifact: artifacts/gone-1.json, digest: '{ZERO}'}}\n"
        f"  - {{artifact: {act}, digest: '{act_digest}'}}\n"
        f"  - {{artifact: {notify}, digest: '{notify_digest}'}}\n"
        "engine: {wrokers: 4}\n"
        "auth: {mode: jwt, issuer: 'https://idp.example', audience: rc, policies: []}\n"
        "connections:\n"
        "  registry: {product: bregg, baseUrl: 'http://127.0.0.1:1',"
        " identity: {bearer: env:STANDIN_TOKEN}}\n"
        "  spare: {product: casewrk, baseUrl: 'http://127.0.0.1:1', identity: {bearer: 7}}\n"
        "listen: {port: 0}\n"  # a port no other process can hold
    )
    return Bad(path, missing, act, notify, act_digest, notify_digest)


def _expected(bad: Bad) -> list[str]:
    path, missing = bad.config, bad.missing
    return [
        f"{path}:3:16: error[file.unreadable]: cannot read {missing}: No such file or directory",
        "  repair: give the path of an existing, readable file",
        f"{path}:5:5: error[config.connection-unbound]: notify version 1 uses connection "
        "'notices' (messaging), which the configuration does not define",
        "  repair: add connections: {notices: {product: messaging, baseUrl: ..., identity: ...}}",
        f"{path}:6:10: error[field.unknown]: engine has no field 'wrokers'",
        "  repair: did you mean 'workers'?",
        f"{path}:7:1: error[config.invalid-value]: auth needs exactly one of jwksFile and jwksUrl",
        "  repair: give the JWKS of the token issuer as a file or an https URL",
        f"{path}:9:23: error[config.connection-kind]: act version 1 needs connection 'registry' "
        "to be breg, but it is bound to 'bregg', which is no product kind",
        "  repair: did you mean product: breg?",
        f"{path}:10:20: error[config.invalid-value]: connection spare is bound to 'casewrk', "
        "which is no product kind",
        "  repair: did you mean product: casework?",
        f"{path}:10:79: error[field.type]: connection spare field 'bearer' must be a string, "
        "not the number 7",
        '  repair: quote it: bearer: "7"',
    ]


def test_serve_reports_every_stage_at_once_and_starts_nothing(tmp_path: Path) -> None:
    bad = _bad_everywhere(tmp_path)
    result = coordinator("serve", "--config", bad.config)
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == _expected(bad)
    assert result.stdout == ""
    assert not (tmp_path / "pg").exists()  # no database was started, nor its directory made


def test_doctor_says_every_problem_of_every_stage_and_starts_nothing(tmp_path: Path) -> None:
    bad = _bad_everywhere(tmp_path)
    path, missing = bad.config, bad.missing
    result = coordinator("doctor", "--config", path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"FAIL  configuration: {path}:6:10: error[field.unknown]: engine has no field "
        "'wrokers': did you mean 'workers'?",
        f"FAIL  configuration: {path}:7:1: error[config.invalid-value]: auth needs exactly one "
        "of jwksFile and jwksUrl: give the JWKS of the token issuer as a file or an https URL",
        f"FAIL  configuration: {path}:10:79: error[field.type]: connection spare field 'bearer' "
        'must be a string, not the number 7: quote it: bearer: "7"',
        f"FAIL  workflows: {path}:3:16: error[file.unreadable]: cannot read {missing}: No such "
        "file or directory: give the path of an existing, readable file",
        f"ok    workflow act 1: {bad.act_digest}",
        f"ok    workflow notify 1: {bad.notify_digest}",
        f"FAIL  connections: {path}:5:5: error[config.connection-unbound]: notify version 1 "
        "uses connection 'notices' (messaging), which the configuration does not define: add "
        "connections: {notices: {product: messaging, baseUrl: ..., identity: ...}}",
        f"FAIL  connections: {path}:9:23: error[config.connection-kind]: act version 1 needs "
        "connection 'registry' to be breg, but it is bound to 'bregg', which is no product "
        "kind: did you mean product: breg?",
        f"FAIL  connections: {path}:10:20: error[config.invalid-value]: connection spare is "
        "bound to 'casewrk', which is no product kind: did you mean product: casework?",
        "ok    listen 127.0.0.1, port 0: a free port is picked at each start",
    ]
    assert result.stderr == "7 of 10 checks failed\n"
    assert not (tmp_path / "pg").exists()


def test_the_later_stages_look_at_what_a_broken_structure_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_TOKEN", "t")
    bad = _bad_everywhere(tmp_path)
    reading = read_config(bad.config)
    assert reading.config is None  # the structure is broken: there is no Config to run
    assert [pin.artifact for pin in reading.pins] == [bad.missing, bad.act, bad.notify]
    assert reading.products == {"registry": "bregg", "spare": "casewrk"}
    with pytest.raises(Refused) as refused:
        load_service(bad.config)
    assert [d.code for d in refused.value.diagnostics] == [
        "field.unknown",
        "config.invalid-value",
        "field.type",
        "file.unreadable",
        "config.connection-unbound",
        "config.connection-kind",
        "config.invalid-value",
    ]


def test_a_connections_section_that_is_no_mapping_is_not_called_unbound(tmp_path: Path) -> None:
    """Whether a workflow's connection is configured cannot be told from a section that
    did not parse: its own problem is the only one said."""
    notify, digest = package("notify", tmp_path / "artifacts")
    path = tmp_path / "config.yaml"
    path.write_text(
        "database: {embedded: {dataDirectory: pg}}\n"
        f"workflows: [{{artifact: {notify}, digest: '{digest}'}}]\n"
        "auth: {mode: none}\n"
        "connections: [notices]\n"
    )
    with pytest.raises(Refused) as refused:
        load_service(path)
    assert [(d.code, d.line) for d in refused.value.diagnostics] == [("field.type", 4)]


def test_a_workflow_connection_configured_under_a_near_name_asks_did_you_mean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_TOKEN", "t")
    notify, digest = package("notify", tmp_path / "artifacts")
    path = tmp_path / "config.yaml"
    path.write_text(
        "database: {embedded: {dataDirectory: pg}}\n"
        f"workflows: [{{artifact: {notify}, digest: '{digest}'}}]\n"
        "auth: {mode: none}\n"
        "connections:\n"
        "  notice: {product: messaging, baseUrl: 'http://127.0.0.1:1',"
        " identity: {bearer: env:STANDIN_TOKEN}}\n"
    )
    with pytest.raises(Refused) as refused:
        load_service(path)
    [problem] = refused.value.diagnostics
    assert (problem.code, problem.line) == ("config.connection-unbound", 2)
    assert problem.repair == "did you mean connections.notice? rename it to notices"


def _bound(tmp_path: Path, registry: str, notices: str, bookings: str) -> Path:
    """A configuration pinning a BReg action (act), a message (notify) and a booking
    (book-appointment), with the given registry parameters and identity, notices
    parameters and bookings identity."""
    packaged = [
        package(name, tmp_path / "artifacts") for name in ("act", "notify", "book-appointment")
    ]
    pins = "".join(f"  - {{artifact: {a}, digest: '{d}'}}\n" for a, d in packaged)
    local = "baseUrl: 'http://127.0.0.1:1', identity: {bearer: env:STANDIN_TOKEN}"
    path = tmp_path / "config.yaml"
    path.write_text(
        "database: {embedded: {dataDirectory: pg}}\n"
        f"workflows:\n{pins}"  # lines 3 to 5
        "auth: {mode: none}\n"
        "connections:\n"
        "  registry:\n"
        "    product: breg\n"
        "    baseUrl: 'http://127.0.0.1:1'\n"
        "    identity:\n"  # line 11
        "      oauth2:\n"
        "        tokenUrl: 'http://127.0.0.1:2/token'\n"
        "        clientId: coordinator\n"
        "        clientSecret: env:CLIENT_SECRET\n"
        f"{registry}"  # lines 16 and 17
        f"  notices: {{product: messaging, {local}, {notices}}}\n"  # line 18
        f"  calendar: {{product: scheduling, {local}}}\n"
        f"  bookings: {{product: scheduling, {bookings}}}\n"  # line 20
    )
    return path


AUTHORITY = (
    "        taskAuthority: {baseUrl: 'http://127.0.0.1:3', issuer: 'urn:c', subject: agent,"
    " exchangeAudience: 'urn:idp', bootstrapResource: 'urn:casework'}\n"
)


def test_connection_bound_parameters_and_task_authority_are_checked_per_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a pinned workflow's operations need of the connections they are bound to:
    the parameters their product takes from the deployment, set and valid, none it does
    not take; a task authority where an operation runs only under one (a booking), and
    none where the product refuses it (a BReg action)."""
    monkeypatch.setenv("STANDIN_TOKEN", "t")
    monkeypatch.setenv("CLIENT_SECRET", "s")
    path = _bound(
        tmp_path,
        AUTHORITY + "    parameters: {accessProfile: 'Not A Profile'}\n",
        "parameters: {sendrProfile: case-notices}",
        "baseUrl: 'http://127.0.0.1:1', identity: {bearer: env:STANDIN_TOKEN}",
    )
    with pytest.raises(Refused) as refused:
        load_service(path)
    found = [(d.code, d.line, d.message, d.repair) for d in refused.value.diagnostics]
    assert [(code, line) for code, line, _, _ in found] == [
        ("config.task-authority-refused", 11),
        ("config.parameter-invalid", 17),
        ("config.parameter-missing", 18),
        ("config.parameter-unknown", 18),
        ("config.task-authority-missing", 20),
    ]
    refused_authority, invalid, missing, unknown, no_authority = found
    assert refused_authority[2:] == (
        "act calls breg/invoke-action on connection registry, whose taskAuthority breg "
        "refuses for it",
        "bind the step to a connection of the product's own service identity",
    )
    assert invalid[2] == (
        "connection registry parameter accessProfile: 'Not A Profile' does not match "
        "'^[a-z][a-z0-9._-]{0,127}$'"
    )
    assert invalid[3].startswith("give accessProfile a value breg takes: the BReg access profile")
    assert missing[2].startswith("connection notices must set messaging's senderProfile: ")
    assert missing[3] == "add parameters: {senderProfile: VALUE} to connection notices"
    assert unknown[2:] == (
        "connection notices sets parameter sendrProfile, which messaging does not have",
        "did you mean senderProfile?",
    )
    assert no_authority[2] == (
        "book-appointment calls scheduling/create-appointment on connection bookings, which "
        "runs only under Casework's task authority"
    )
    mended = _bound(
        tmp_path,
        "    parameters: {accessProfile: coordinator}\n",
        "parameters: {senderProfile: case-notices}",
        "baseUrl: 'http://127.0.0.1:1', identity: {oauth2: {tokenUrl: 'http://127.0.0.1:2/t',"
        " clientId: c, clientSecret: env:CLIENT_SECRET,"
        + AUTHORITY.removeprefix("        ").removesuffix("\n")
        + "}}",
    )
    reading, _ = read_service(mended)
    assert reading.problems.all() == []


def test_a_workflow_naming_its_data_subject_needs_custody_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without custody its runs' data would be kept in clear, where no erasure reaches."""
    monkeypatch.setenv("SUBJECT_TEST_TOKEN", "x")
    artifact, digest = package("subject-lookup", tmp_path / "artifacts")
    path = tmp_path / "config.yaml"
    path.write_text(
        "database: {embedded: {dataDirectory: pg}}\n"
        f"workflows:\n  - {{artifact: {artifact}, digest: '{digest}'}}\n"
        "auth: {mode: none}\n"
        "connections:\n"
        "  records: {product: breg, baseUrl: 'http://127.0.0.1:1',\n"
        "            identity: {bearer: env:SUBJECT_TEST_TOKEN}}\n"
    )
    reading, _ = read_service(path)
    [found] = reading.problems.of("workflows")
    assert (found.code, found.position) == ("config.invalid-value", Position(3, 5))
    assert "names its data subject (input.applicantId)" in found.message
    assert "custody" in found.repair
