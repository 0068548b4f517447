"""Property-based fuzzing of the HTTP API from its own OpenAPI document (schemathesis).

Every response must be documented (status, content type, schema), nothing may answer
5xx, and every error must be problem+json with a stable code. Each operation is fuzzed
as an operator, without a token, and with a valid token of a client no policy names;
each POST operation also with a body over the configured limit — so the refusals (401,
403, 413) are fuzzed, not only what an operator gets. The requests sent are counted by
operation, identity and status, printed (``pytest -s``), and each operation must have
had the cases configured for it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import positive_data_acceptance

from registry_coordinator.http.auth import mint
from tests.support import Cluster, Services, development_jwt

BODY_LIMIT = 4096


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


@dataclass(frozen=True)
class Identity:
    """Who the fuzz calls as, how many cases each operation gets as them, the refusal the
    operations that document it must give them (None: none in particular), and a body
    that replaces every generated one (None: generated), sent to POST operations only."""

    name: str
    token: str | None  # None: no Authorization header at all
    max_examples: int
    refusal: int | None = None
    body: Any = None

    def authorize(self, case: Any) -> dict[str, str]:
        """The headers to send over the case's own. A secured operation's case carries a
        bearer schemathesis generated: the token replaces it, or without one it is removed,
        so the request really has none. The token goes as an explicit header, which is what
        tells schemathesis's ignored_auth check that it is meant to be valid."""
        if self.token is None:
            case.headers.pop("Authorization", None)
            return {}
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture(scope="module")
def live_api(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, tuple[Identity, ...]]]:
    """A service with real JWT authentication and a small body limit, and who calls it: an
    operator, nobody, a client whose token is valid but which no policy names, and the
    operator again with every body over the limit.

    The operator gets the most cases: only it gets past authorization to each route's own
    validation. A refusal happens before any of that, so fewer cases cover it.
    """
    directory: Path = tmp_path_factory.mktemp("fuzz")
    key = directory / "signing-key.pem"
    operator = mint(key, "operators", ["coordinator.operate"], 1800)
    stranger = mint(key, "strangers", ["coordinator.operate"], 1800)
    auth = development_jwt(
        key, {"client": "operators", "scopes": ["coordinator.operate"], "operator": True}
    )
    dsn = cluster.create_database(migrated=True)
    extra = {"limits": {"requestBody": BODY_LIMIT}, "auth": auth}
    with Services(directory, dsn) as services:
        service = services(["timed-choice"], extra=extra)
        yield (
            service.url,
            (
                Identity("operator", operator, 60),
                Identity("no token", None, 15, 401),
                Identity("no policy", stranger, 15, 403),
                Identity("oversized", operator, 15, 413, {"reason": "x" * BODY_LIMIT}),
            ),
        )


class Tally:
    """Every response the test process receives while fuzzing, by operation, identity and
    status.

    Counted in ``requests.Session.send``, so the requests schemathesis's checks send
    themselves (ignored_auth resends a case without its token, in a session of its own)
    are counted with the cases' own.
    """

    def __init__(self) -> None:
        self.sent: Counter[tuple[str, str, int]] = Counter()

    @contextmanager
    def sending(self, operation: Any, identity: Identity) -> Iterator[None]:
        """Count what is received while ``identity`` fuzzes ``operation``."""
        send = requests.Session.send

        def counting(session: requests.Session, request: Any, **kwargs: Any) -> Any:
            response = send(session, request, **kwargs)
            self.sent[(operation.label, identity.name, response.status_code)] += 1
            return response

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(requests.Session, "send", counting)
            yield

    def statuses(self, operation: Any, identity: Identity) -> Counter[int]:
        key = (operation.label, identity.name)
        return Counter({s: n for (label, who, s), n in self.sent.items() if (label, who) == key})

    def table(self) -> str:
        """Per operation, its total and each status's count; below it, the same per identity."""
        rows: dict[str, dict[str, Counter[int]]] = {}
        for (label, who, status), count in self.sent.items():
            rows.setdefault(label, {}).setdefault(who, Counter())[status] = count
        width = max(map(len, rows))

        def line(label: str, who: str, statuses: Counter[int]) -> str:
            counts = " ".join(f"{status}:{statuses[status]}" for status in sorted(statuses))
            return f"{label:<{width}}  {who:<10}{statuses.total():>5}  {counts}"

        lines = []
        for label in sorted(rows):
            lines.append(line(label, "all", sum(rows[label].values(), Counter())))
            lines.extend(line("", who, rows[label][who]) for who in sorted(rows[label]))
        return "\n".join(lines)


def cases_expected(operation: Any, identity: Identity) -> int:
    """Requests an operation must have had as ``identity``: one per generated case, so its
    max_examples — or a single one when the operation has nothing to generate (no
    parameter, header or body), since Hypothesis stops once it has tried the only case."""
    inputs = (operation.path_parameters, operation.headers, operation.query, operation.cookies)
    varies = any(len(found) for found in inputs) or len(operation.body) > 0
    return identity.max_examples if varies else 1


def shortfalls(operation: Any, identity: Identity, statuses: Counter[int]) -> Iterator[str]:
    """What this part of the fuzz did not do that it must have: send every case configured,
    and, where the document promises the identity's refusal, get it.

    A body is read, and one over the limit refused, before anything else is looked at, so
    every such request gets the refusal. A missing or useless token is refused only by a
    secured operation, and there at least once: a generated path that misses the route is
    404 before any token is read.
    """
    expected = cases_expected(operation, identity)
    if statuses.total() < expected:
        yield f"{statuses.total()} requests of the {expected} cases configured"
    if identity.refusal is None:
        return
    if identity.body is not None:
        if set(statuses) != {identity.refusal}:
            yield f"its body answered {dict(statuses)}, not only {identity.refusal}"
        return
    secured = any(True for _ in operation.security.iter_parameters())
    documented = str(identity.refusal) in operation.definition.raw["responses"]
    if secured and documented and identity.refusal not in statuses:
        yield f"never refused with {identity.refusal}: {dict(statuses)}"


def fuzz(operation: Any, identity: Identity) -> None:
    """Run one operation's generated cases against the live service as ``identity``.

    Every check runs but one: that every request the document allows is accepted. What
    the service accepts also depends on what a static document cannot state — each
    pinned workflow's own input schema, text without NUL characters, page cursors the
    API issued, who the caller is — and refusing those is correct (422, 400, 401, 403),
    not a mismatch.
    """
    strategy = (
        operation.as_strategy()
        if identity.body is None
        else operation.as_strategy(body=identity.body)
    )

    @given(case=strategy)
    @settings(
        max_examples=identity.max_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def cases(case: Any) -> None:
        case.call_and_validate(
            headers=identity.authorize(case), excluded_checks=[positive_data_acceptance]
        )

    cases()


def test_the_api_matches_its_document(live_api: tuple[str, tuple[Identity, ...]]) -> None:
    """Each operation of /openapi.json, fuzzed as each identity; the document is the oracle.

    Schemathesis leaves out the operation that served it the document (GET /openapi.json).
    """
    url, identities = live_api
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) == 26
    plan = [
        (operation, identity)
        for operation in operations
        for identity in identities
        if identity.body is None or operation.method.upper() == "POST"
    ]
    tally = Tally()
    for operation, identity in plan:
        with tally.sending(operation, identity):
            fuzz(operation, identity)
    table = tally.table()
    print(f"\nrequests sent, by operation, identity and status:\n{table}")
    missing = [
        f"{operation.label} as {identity.name}: {shortfall}"
        for operation, identity in plan
        for shortfall in shortfalls(operation, identity, tally.statuses(operation, identity))
    ]
    assert not missing, "\n".join(missing) + "\n" + table
