"""Reviewed external reads, offline: what a workflow may ask, what an answer becomes, what
an operator's review may say, and where no read may go.

Held to the facts of the real Rust coordinator's ``external_http.rs`` and its tests (the
fixture ``tests/contracts/fixtures/external-http.json`` names the files and commit).
"""

from __future__ import annotations

import ipaddress
import string
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.config import read_config
from registry_coordinator.engine import destinations
from registry_coordinator.semantics import external
from registry_coordinator.semantics.codes import FailureCode
from registry_coordinator.semantics.steps import (
    Advance,
    Failed,
    Reply,
    ReplyKind,
    Retry,
    RunRecord,
    Send,
    enter,
    settle,
)
from tests.support import ROOT

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
#: The review of the office directory the Rust coordinator's tests read.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["status", "body"],
    "additionalProperties": False,
    "properties": {
        "status": {"type": "integer", "minimum": 100, "maximum": 599},
        "body": {
            "anyOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "required": ["items"],
                    "additionalProperties": False,
                    "properties": {
                        "items": {
                            "type": "array",
                            "maxItems": 10,
                            "items": {
                                "type": "object",
                                "required": ["id"],
                                "additionalProperties": False,
                                "properties": {"id": {"type": "string", "maxLength": 64}},
                            },
                        }
                    },
                },
            ]
        },
    },
}
REVIEWED = external.Reviewed(frozenset({"offices"}), frozenset({"district"}), SCHEMA)


def definition() -> Definition:
    checked = check_source(ROOT / "tests" / "workflows" / "external-read.yaml")
    assert checked.definition is not None
    return checked.definition


EXTERNAL_READ = definition()


def sent(district: str) -> Send:
    record = RunRecord("run-1", {"district": district}, NOW, NOW.replace(year=2027))
    transition = enter(EXTERNAL_READ, "read", record, NOW)
    assert isinstance(transition, Send)
    return transition


def answered(status: int, body: bytes, exceeded: bool = False) -> Any:
    reply = Reply(ReplyKind.RESPONSE, status, body, exceeded=exceeded)
    return settle(EXTERNAL_READ, "read", reply, 1, NOW, reviewed=REVIEWED)


def test_a_query_value_is_sent_as_data_under_the_reviewed_path() -> None:
    request = sent("north &south=http://elsewhere.test/?x=1").request
    assert (request.method, request.body, request.idempotency_key) == ("GET", None, None)
    assert (
        request.target
        == "/offices?district=north+%26south%3Dhttp%3A%2F%2Felsewhere.test%2F%3Fx%3D1"
    )
    assert REVIEWED.refusal(request.target) is None


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("/districts", "the path read is none of the connection's paths: offices"),
        ("/offices?token=secret-canary", "query parameter 'token' is not one the connection"),
        ("/offices?district=a&district=b" + "&district=c" * 15, "at most 16 query parameters"),
        ("/offices?district=" + "x" * 1025, "query parameter 'district' has a value no reviewed"),
        ("/offices?district=north%00", "query parameter 'district' has a value no reviewed"),
    ],
)
def test_a_read_the_review_does_not_allow_is_refused_before_it_is_sent(
    target: str, why: str
) -> None:
    refusal = REVIEWED.refusal(target)
    assert refusal is not None and refusal.startswith(why)


SEGMENT = st.text(string.ascii_letters + string.digits + "._~-", min_size=1, max_size=12)


@given(st.lists(SEGMENT, min_size=1, max_size=4))
def test_a_path_is_read_only_as_reviewed_relative_segments(segments: list[str]) -> None:
    path = "/".join(segments)
    dot_segment = any(s in (".", "..") for s in segments)
    assert bool(external.PATH.match(path)) is not dot_segment
    for escape in ("/" + path, path + "/", path + "//x", "../" + path, path + "?q=1", "a\\b"):
        assert not external.PATH.match(escape)


@pytest.mark.parametrize("status", [200, 400, 404, 429, 500])
def test_every_completed_status_is_the_workflows_to_branch_on(status: int) -> None:
    transition = answered(status, b'{"items": []}')
    assert transition == Advance("known", "next", {"status": status, "body": {"items": []}}, True)


def test_an_empty_answer_is_a_null_body() -> None:
    assert answered(404, b"").output == {"status": 404, "body": None}


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_never_followed(status: int) -> None:
    transition = answered(status, b"")
    assert isinstance(transition, Failed)
    assert transition.code is FailureCode.EXTERNAL_REDIRECT


@pytest.mark.parametrize(
    ("body", "exceeded", "why"),
    [
        (b"not-json-sensitive-canary", False, "the body is not strict JSON"),
        (b'{"items":[],"items":[{"id":"different"}]}', False, "the body is not strict JSON"),
        (b'{"items":[{"id":7}]}', False, "does not fit the connection's responseSchema"),
        (b'{"items":[],"sensitiveCanary":"x"}', False, "does not fit the connection's"),
        (b"", True, "exceeds the connection's responseLimit"),
    ],
)
def test_an_answer_that_breaks_the_review_is_not_released(
    body: bytes, exceeded: bool, why: str
) -> None:
    transition = answered(200, body, exceeded)
    assert isinstance(transition, Failed)
    assert transition.code is FailureCode.EXTERNAL_INVALID_RESPONSE
    assert why in transition.detail
    assert "canary" not in transition.detail  # what it said stays out of the history


@pytest.mark.parametrize("kind", [ReplyKind.NOT_SENT, ReplyKind.LOST])
def test_no_answer_is_read_again_later(kind: ReplyKind) -> None:
    reply = Reply(kind, detail="no answer within requestTimeout PT2S")
    assert isinstance(settle(EXTERNAL_READ, "read", reply, 1, NOW, reviewed=REVIEWED), Retry)


def test_offline_any_answer_is_taken_as_status_and_body() -> None:
    """``coordinator test`` knows no deployment's review: the catalog's envelope only."""
    reply = Reply(ReplyKind.RESPONSE, 200, b'{"anything": [1]}')
    transition = settle(EXTERNAL_READ, "read", reply, 1, NOW)
    assert isinstance(transition, Advance)
    assert transition.output == {"status": 200, "body": {"anything": [1]}}


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"$ref": "https://schemas.example.test/read"}, "refers outside itself"),
        ({"$id": "https://schemas.example.test/read", "type": "object"}, "schema resource"),
        ({"type": "no-such-type"}, "not a JSON Schema 2020-12"),
        ([], "must be a JSON Schema object"),
    ],
)
def test_a_review_schema_refers_to_nothing_outside_itself(schema: Any, why: str) -> None:
    problem = external.schema_problem(schema)
    assert problem is not None and why in problem


def test_a_local_reference_is_a_review_schema() -> None:
    local = {"$defs": {"id": {"type": "string"}}, "properties": {"body": {"$ref": "#/$defs/id"}}}
    assert external.schema_problem(local) is None


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254",
        "169.254.170.2",
        "fe80::1",
        "::ffff:169.254.169.254",
        "fd00:ec2::254",
        "100.100.100.200",
    ],
)
def test_no_read_goes_where_cloud_metadata_answers(address: str) -> None:
    assert destinations.forbidden(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.1", "192.168.1.10", "::1", "2001:db8::1"])
def test_an_institutions_own_addresses_may_be_read(address: str) -> None:
    assert not destinations.forbidden(ipaddress.ip_address(address))


def _config(tmp_path: Path, connection: str) -> list[str]:
    """The problems a configuration with one external connection is refused with."""
    path = tmp_path / "coordinator.yaml"
    path.write_text(
        "database: {dsn: 'postgresql://coordinator@db/coordinator'}\n"
        "auth: {mode: none}\n"
        f"connections:\n  directory:\n{connection}"
    )
    reading = read_config(path)
    return [d.message for d in reading.problems.all()]


GOOD = """\
    product: external-http
    baseUrl: https://directory.example.test/institution
    paths: [offices]
    queryParameters: [district]
    responseSchema: {type: object}
"""


def test_a_reviewed_connection_loads_with_the_contracts_bounds(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.yaml"
    path.write_text(
        "database: {dsn: 'postgresql://coordinator@db/coordinator'}\n"
        f"auth: {{mode: none}}\nconnections:\n  directory:\n{GOOD}"
    )
    reading = read_config(path)
    connection = reading.connections["directory"]
    assert connection.identity is None  # a public read: no credential, never a caller's
    assert connection.external == external.Reviewed(
        frozenset({"offices"}), frozenset({"district"}), {"type": "object"}
    )
    assert connection.request_timeout.total_seconds() == 2
    assert connection.response_limit == 65536


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("baseUrl: http://10.0.0.1/", "HTTPS, or HTTP on a numeric loopback"),
        ("baseUrl: http://localhost/", "HTTPS, or HTTP on a numeric loopback"),
        ("baseUrl: https://user:secret@directory.example.test/", "no credentials, query"),
        ("baseUrl: https://directory.example.test/?token=secret", "no credentials, query"),
        ("baseUrl: https://directory.example.test/#fragment", "no credentials, query"),
        ("baseUrl: https://169.254.169.254/", "link-local"),
        ("paths: ['../offices']", "relative paths"),
        ("paths: ['/offices']", "relative paths"),
        ("paths: ['offices?district=north']", "relative paths"),
        ("paths: ['offices//north']", "relative paths"),
        ("paths: [offices, offices]", "distinct"),
        ("paths: []", "1 to 16"),
        ("queryParameters: [district, district]", "distinct"),
        ("responseSchema: {$ref: 'https://schemas.example.test/read'}", "refers outside"),
        ("requestTimeout: PT3S", "at most 2 seconds"),
        ("responseLimit: 65537", "responseLimit"),
        ("webhookSecret: env:X", "webhookSecret"),
    ],
)
def test_an_unsafe_review_is_refused_where_it_is_written(
    tmp_path: Path, change: str, said: str
) -> None:
    name = change.split(":", 1)[0]
    lines = [line for line in GOOD.splitlines() if not line.strip().startswith(name + ":")]
    problems = _config(tmp_path, "\n".join([*lines, "    " + change]) + "\n")
    assert any(said in problem for problem in problems), problems


def test_an_external_read_never_runs_under_task_authority(tmp_path: Path) -> None:
    identity = """\
    identity:
      oauth2:
        tokenUrl: https://issuer.example.test/token
        clientId: directory-reader
        clientSecret: env:HOME
        resource: urn:example:directory
        taskAuthority:
          baseUrl: https://casework.example.test
          issuer: https://issuer.example.test
          subject: directory-reader
          exchangeAudience: urn:example:exchange
          bootstrapResource: urn:example:casework
"""
    problems = _config(tmp_path, GOOD + identity)
    assert any("never runs under Casework's task authority" in p for p in problems), problems
