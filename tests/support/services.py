"""The services one test starts (:class:`Services`, the ``services`` fixture): configured,
deployed beside stand-ins, and every one stopped when the test ends; with what tests read
of a running service (its metrics) and the deployments several tests share."""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from registry_coordinator.http.auth import mint
from registry_coordinator.semantics.codes import RunState
from tests.support.config import connection, write_config
from tests.support.network import free_port
from tests.support.processes import Service, running
from tests.support.standins import HANG_ONCE, StandIns, stand_ins
from tests.support.tokens import oauth2, signed_in
from tests.support.waiting import wait_state


class Services:
    """The services one test (or one module) starts on its database, with their files in
    one directory; every one of them, and every stand-in, is stopped when it ends.

    ``services(workflows, **options)`` is the usual start: a configuration pinning
    ``workflows`` (``options`` are :func:`write_config`'s), migrated, and ``coordinator
    serve`` listening on it. A test that starts the service later, again, or twice on one
    configuration takes the two apart: :meth:`configure`, then :meth:`start`.
    """

    def __init__(self, directory: Path, dsn: str) -> None:
        self.directory = directory
        self.dsn = dsn
        self._started = ExitStack()

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._started.close()

    def __call__(self, workflows: Sequence[str | Path], **options: Any) -> Service:
        return self.start(self.configure(workflows, **options))

    def configure(self, workflows: Sequence[str | Path], **options: Any) -> Path:
        """A configuration, for the test to start a service on when it chooses (its
        database, the ``dsn`` fixture's, is migrated)."""
        return write_config(self.directory, self.dsn, workflows, **options)

    def start(self, config: Path, log: Path | None = None, crash_at: str | None = None) -> Service:
        """A service listening on ``config``, logging to ``log`` (``service.log`` unless
        named), killing itself at the crash point ``crash_at`` if one is named."""
        log = log or self.directory / "service.log"
        return self._started.enter_context(running(config, log, crash_at))

    def deploy(
        self,
        workflows: Sequence[str | Path],
        connections: dict[str, tuple[str, dict[str, Any]]],
        *,
        webhooks: bool = False,
        stand_in_env: dict[str, str] | None = None,
        also: dict[str, int] | None = None,
        sign_in: bool = False,
        **options: Any,
    ) -> tuple[Service, StandIns]:
        """Stand-in products and a migrated service bound to them, both running.

        ``connections`` maps each connection name to its product kind and settings; one
        stand-in serves each kind, and ``also`` names more stand-ins (the IdP) by port.
        With ``webhooks`` Casework pushes its completions to the service, to the first
        connection bound to it (authenticated with the tests' webhook secret). With
        ``sign_in`` the stand-ins serve the OpenID Connect issuer too, and the service
        trusts it (:func:`signed_in`).
        """
        port = free_port()
        ports: dict[str, int] = dict(also or {})
        bound: dict[str, dict[str, Any]] = {}
        hooks: dict[str, str] = {}
        for name, (kind, settings) in connections.items():
            ports.setdefault(kind, free_port())
            bound[name] = connection(kind, ports[kind], **settings)
            if webhooks and kind == "casework":
                secret = {"secret": "env:STANDIN_WEBHOOK_SECRET"}
                bound[name].setdefault("completions", secret)
                hooks.setdefault(kind, f"http://127.0.0.1:{port}/v1/results/{name}")
        issuer = (free_port(), self.directory / "keys" / "issuer.pem") if sign_in else None
        if issuer is not None:
            options["extra"] = {**signed_in(*issuer), **options.get("extra", {})}
        config = self.configure(workflows, port=port, connections=bound, **options)
        products = self._started.enter_context(
            stand_ins(
                self.directory / "standins.log",
                ports,
                webhooks=hooks,
                env=stand_in_env,
                delivery_delay=0.3,
                issuer=issuer,
            )
        )
        return self.start(config), products


def issuer_token(services: Services, service: Service, client: str, scopes: list[str]) -> str:
    """A bearer token for ``client`` as the stand-in issuer of a service deployed with
    ``sign_in`` signs them, for calling the API beside the console."""
    issuer = json.loads(service.config.read_text())["auth"]["issuer"]
    key = services.directory / "keys" / "issuer.pem"
    return mint(key, client, scopes, 600, issuer=issuer)


def started_by_case_portal(
    services: Services, service: Service, workflow: str, run_input: Any, key: str
) -> tuple[str, str]:
    """A run of ``workflow`` the case portal started through the API of a service deployed
    with ``sign_in``, and the portal's token."""
    token = issuer_token(services, service, "case-portal", ["coordinator.runs"])
    started = service.http.post(
        "/v1/runs",
        json={"workflow": workflow, "input": run_input},
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": key},
    )
    assert started.status_code == 201, started.text
    return str(started.json()["id"]), token


def moved(config: Path, connection: str, port: int) -> Path:
    """A copy of the service's ``config`` (beside it) in which an operator moved
    ``connection`` to another port on loopback."""
    document = json.loads(config.read_text())
    document["connections"][connection]["baseUrl"] = f"http://127.0.0.1:{port}"
    copy = config.with_name(f"moved-{connection}.json")
    copy.write_text(json.dumps(document))
    return copy


def held_notice(
    dsn: str, services: Services, **settings: Any
) -> tuple[Service, StandIns, str, str]:
    """A service whose people sign in at the stand-in issuer, with one run of ``notify`` the
    case portal started, held outcome-unknown (Messaging applied it; its answer never came),
    and the case portal's token. The connection asks Messaging nothing itself (no
    verification), so the run is held at once, its receipt left for an operator's reconcile;
    ``settings`` are more of the connection's (``fourEyes``)."""
    notices = {"requestTimeout": "PT1S", "verification": {"attempts": 0}, **settings}
    service, products = services.deploy(
        ["notify"], {"notices": ("messaging", notices)}, sign_in=True
    )
    products.faults("messaging", HANG_ONCE)
    run, token = started_by_case_portal(
        services, service, "notify", {"email": "a@example.org"}, "notice-1"
    )
    wait_state(dsn, run, RunState.HELD)
    return service, products, run, token


def metrics(service: Service) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The service's /metrics, parsed: each sample's value by its name and sorted labels."""
    response = service.http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def notify_with_oauth2(
    services: Services, monkeypatch: pytest.MonkeyPatch, **options: Any
) -> tuple[Service, StandIns]:
    """The notify workflow against a Messaging stand-in that takes tokens from the stand-in
    IdP, where Coordinator authenticates with a client secret."""
    idp = free_port()
    monkeypatch.setenv("STANDIN_CLIENT_SECRET", "s3cret-for-tests")  # the service's and IdP's
    identity = oauth2(idp, clientSecret="env:STANDIN_CLIENT_SECRET")
    notices = {"notices": ("messaging", {"identity": identity})}
    return services.deploy(["notify"], notices, also={"idp": idp}, **options)
