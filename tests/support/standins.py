"""The stand-in products (BReg, Casework, Messaging, the IdP, the OpenID Connect issuer) as
one ``coordinator stand-ins`` process: their control routes (ledger, faults), reviews
requested at Casework, and its staff deciding them."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from registry_coordinator.devtools import reviewer
from tests.support.processes import coordinator_process
from tests.support.tokens import PARAMETERS, STAFF_TOKEN, STANDIN_TOKEN
from tests.support.waiting import until

#: Messaging keeps the next message, and its answer never comes: the call's outcome is unknown.
HANG_ONCE = {"match": "POST /v1/messages", "mode": "hang-after-apply", "seconds": 30, "times": 1}
#: A review's result status, and the staff decision that settles it (with its outcome).
DECISIONS = {
    "approved": ("approve", None),
    "rejected": ("reject", "incomplete-evidence"),
    "changes-requested": ("changes-requested", "missing-documents"),
}


class StandIns:
    """A ``coordinator stand-ins`` process serving some products, each on its own port, and
    the stand-in OpenID Connect issuer if asked for."""

    def __init__(
        self,
        log: Path,
        ports: dict[str, int],
        webhooks: dict[str, str] | None = None,
        delivery_delay: float = 0.5,
        env: dict[str, str] | None = None,
        issuer: tuple[int, Path] | None = None,
    ) -> None:
        self.ports = ports
        args = ["stand-ins", "--delivery-delay", str(delivery_delay)]
        args += [f"--product={name}={port}" for name, port in ports.items()]
        args += [f"--webhook={name}={url}" for name, url in (webhooks or {}).items()]
        if issuer is not None:  # the stand-in OpenID Connect issuer, signing with this key
            args += [f"--issuer={issuer[0]}", f"--issuer-key={issuer[1]}"]
        self.process = coordinator_process(args, log, env=env, stdout=subprocess.PIPE)
        assert self.process.stdout is not None
        for _ in range(len(ports) + (issuer is not None)):
            line = self.process.stdout.readline().decode()
            assert line, f"stand-ins did not start:\n{log.read_text()}"

    def url(self, product: str) -> str:
        return f"http://127.0.0.1:{self.ports[product]}"

    def ledger(self, product: str) -> dict[str, Any]:
        return dict(httpx.get(self.url(product) + "/_control/ledger", timeout=5).json())

    def wait_in_flight(self, product: str, count: int = 1, timeout: float = 30) -> None:
        """Until ``count`` requests are in flight at ``product`` (received, not answered)."""
        deadline = time.monotonic() + timeout
        while (flying := self.ledger(product)["inFlight"]) < count:
            assert time.monotonic() < deadline, f"{flying} requests in flight at {product}"
            time.sleep(0.02)

    def faults(self, product: str, *rules: dict[str, Any]) -> None:
        response = httpx.post(self.url(product) + "/_control/faults", json=list(rules), timeout=5)
        assert response.status_code == 200

    def feed_read(self) -> None:
        """Until the service has read Casework's feed once (its first pass, at startup):
        whatever is decided after this is on the feed only for the next pass."""
        until(
            lambda: self.requests("casework", "GET", "/v1/review-results"),
            "the service's first read of Casework's feed",
        )

    def decided_reviews(self, count: int, kind: str) -> list[str]:
        """Make ``count`` review requests at Casework and have staff approve each; their
        request ids."""
        return [self.review(kind, decision="approved") for _ in range(count)]

    def review(self, kind: str = "application-review", decision: str | None = None) -> str:
        """A review request Coordinator's producer made at Casework (decided by staff as
        ``decision``, if given); its request id."""
        headers = {
            "Authorization": f"Bearer {STANDIN_TOKEN}",
            "Registry-Casework-Profile": PARAMETERS["casework"]["profile"],
            "Idempotency-Key": f"test-{uuid.uuid4()}",
        }
        subject = {
            "source": "applications-registry",
            "type": "application",
            "id": str(uuid.uuid4()),
            "version": "1",
            "digest": "sha256:" + "0" * 64,
        }
        body = {
            "kind": kind,
            "subject": subject,
            "requesterReference": "test",
            "context": {"strategy": "submitted", "snapshot": {}},
        }
        created = httpx.post(
            self.url("casework") + "/v1/review-requests", json=body, headers=headers
        )
        assert created.status_code == 201, created.text
        request_id = str(created.json()["requestId"])
        if decision is not None:
            decide(self, request_id, decision)
        return request_id

    def requests(self, product: str, method: str, path_prefix: str) -> list[dict[str, Any]]:
        return [
            r
            for r in self.ledger(product)["requests"]
            if r["method"] == method and r["path"].startswith(path_prefix)
        ]

    def stop(self) -> None:
        """Kill the process, and close the pipe its ports were announced on."""
        self.process.kill()
        self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


@contextmanager
def stand_ins(log: Path, ports: dict[str, int], **options: Any) -> Iterator[StandIns]:
    products = StandIns(log, ports, **options)
    try:
        yield products
    finally:
        products.stop()


def decide(products: StandIns, request_id: str, decision: str = "approved") -> None:
    """A staff member claims the review ``request_id``'s task at the stand-in Casework and
    decides it, so that its result's status is ``decision``."""
    kind, outcome = DECISIONS[decision]
    reviewer.decide(products.url("casework"), request_id, kind, STAFF_TOKEN, outcome)


def new_review(products: StandIns) -> str:
    """A review request at the stand-in Casework, not decided yet."""
    return products.review()
