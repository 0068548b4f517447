"""Property-based fuzzing of the HTTP API from its own OpenAPI document (schemathesis).

Every response must be documented (status, content type, schema), nothing may answer
5xx, and every error must be problem+json with a stable code.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import positive_data_acceptance

from registry_coordinator.auth import DEVELOPMENT_AUDIENCE, DEVELOPMENT_ISSUER, jwks_path, mint

from .harness import Cluster, migrate, running, write_config


@schemathesis.check
def errors_are_problems(ctx: Any, response: Any, case: Any) -> bool | None:
    """A refusal is application/problem+json with a code, whatever the request."""
    if response.status_code >= 400:
        media = response.headers.get("content-type", [""])
        media = media[0] if isinstance(media, list) else media
        assert media.startswith("application/problem+json"), (response.status_code, media)
        body = response.json()
        assert isinstance(body.get("code"), str) and body["code"], body
        assert body.get("status") == response.status_code, body
    return None


@pytest.fixture(scope="module")
def live_api(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """A service with real JWT authentication, and an operator's token for it."""
    directory: Path = tmp_path_factory.mktemp("fuzz")
    key = directory / "signing-key.pem"
    token = mint(key, "operators", ["coordinator.operate"], 1800)
    auth = {
        "mode": "jwt",
        "issuer": DEVELOPMENT_ISSUER,
        "audience": DEVELOPMENT_AUDIENCE,
        "jwksFile": str(jwks_path(key)),
        "policies": [{"client": "operators", "scopes": ["coordinator.operate"], "operator": True}],
    }
    dsn = cluster.create_database()
    extra = {"limits": {"requestBody": 4096}, "auth": auth}
    config = write_config(directory, dsn, ["timed-choice"], extra=extra)
    migrate(config)
    with running(config, directory / "service.log") as service:
        yield service.url, token


def fuzz(operation: Any, token: str) -> None:
    """Run one operation's generated cases against the live service.

    Every check runs but one: that every request the document allows is accepted. What
    the service accepts also depends on what a static document cannot state — each
    pinned workflow's own input schema, text without NUL characters, page cursors the
    API issued — and refusing those is correct (422, 400), not a mismatch.
    """

    @given(case=operation.as_strategy())
    @settings(
        max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def cases(case: Any) -> None:
        case.call_and_validate(
            headers={"Authorization": f"Bearer {token}"},
            excluded_checks=[positive_data_acceptance],
        )

    cases()


def test_the_api_matches_its_document(live_api: tuple[str, str]) -> None:
    """Each operation of /openapi.json, fuzzed as an operator; the document is the oracle."""
    url, token = live_api
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) == 14
    for operation in operations:
        fuzz(operation, token)
