"""A connection edited under live runs: runs holding requests sealed under its old binding
are reported (``doctor``, ``/ready``), and ``retry-same`` of one sends nowhere until the
operator says where — to the address it was sealed to, or to the connection as it is now."""

from __future__ import annotations

from pathlib import Path

from registry_coordinator.semantics.codes import RunState
from tests.support import (
    HANG_ONCE,
    Services,
    coordinator,
    events,
    free_port,
    moved,
    stand_ins,
    wait_state,
)

HELD_AT_ONCE = {"requestTimeout": "PT1S", "verification": {"attempts": 0}}


def test_a_changed_base_url_is_reported_and_retry_same_asks_where(
    dsn: str, services: Services, tmp_path: Path
) -> None:
    service, products = services.deploy(["notify"], {"notices": ("messaging", HELD_AT_ONCE)})
    products.faults("messaging", HANG_ONCE)
    run = service.start_run("notify", {"email": "a@example.org"})
    wait_state(dsn, run, RunState.HELD)
    assert service.stop() == 0
    sealed_to = f"{products.url('messaging')}/v1/messages"

    port = free_port()  # the operator moved Messaging to another address
    elsewhere_config = moved(service.config, "notices", port)

    looked = coordinator("doctor", "--config", elsewhere_config)
    assert "WARN  1 unfinished runs hold requests sealed under a binding since changed" in (
        looked.stdout
    ), looked.stdout
    assert f"sealed to {products.url('messaging')} over notices" in looked.stdout
    assert sealed_to not in looked.stdout  # the request's own address is the run's data

    with stand_ins(tmp_path / "moved-standins.log", {"messaging": port}) as elsewhere:
        again = services.start(elsewhere_config, tmp_path / "moved.log")
        part = again.http.get("/ready").json()["parts"]["bindings"]
        assert part["ok"] is True and part["changed"] == 1, part

        asked = again.http.post(f"/v1/runs/{run}/retry-same", json={"reason": "moved"})
        assert (asked.status_code, asked.json()["code"]) == (409, "run.binding-changed")
        problem = asked.json()
        assert problem["sealed"]["baseUrl"] == products.url("messaging")
        assert problem["current"]["baseUrl"] == f"http://127.0.0.1:{port}"
        assert sealed_to in problem["detail"] and "baseUrl" in problem["detail"]

        sent = again.http.post(
            f"/v1/runs/{run}/retry-same", json={"reason": "moved", "binding": "current"}
        )
        assert sent.status_code == 200, sent.text
        wait_state(dsn, run, RunState.FINISHED)
        resent = elsewhere.requests("messaging", "POST", "/v1/messages")
        assert [r["key"] for r in resent] == [f"coordinator:{run}:send"]  # the same key
        assert again.http.get("/ready").json()["parts"]["bindings"]["changed"] == 0
    # The old address saw the first sending only.
    assert len(products.requests("messaging", "POST", "/v1/messages")) == 1
    chose = [e for e in events(dsn, run) if e["kind"] == "retry-same"][-1]["detail"]["binding"]
    assert chose == {
        "chose": "current",
        "sealed": sealed_to,
        "current": f"http://127.0.0.1:{port}/v1/messages",
    }


def test_an_unchanged_binding_resends_without_asking(dsn: str, services: Services) -> None:
    service, products = services.deploy(["notify"], {"notices": ("messaging", HELD_AT_ONCE)})
    products.faults("messaging", HANG_ONCE)
    run = service.start_run("notify", {"email": "a@example.org"})
    wait_state(dsn, run, RunState.HELD)
    assert service.http.get("/ready").json()["parts"]["bindings"] == {"ok": True, "changed": 0}
    sent = service.http.post(f"/v1/runs/{run}/retry-same", json={"reason": "checked"})
    assert sent.status_code == 200, sent.text
    wait_state(dsn, run, RunState.FINISHED)
    assert "binding" not in [e for e in events(dsn, run) if e["kind"] == "retry-same"][-1]["detail"]
