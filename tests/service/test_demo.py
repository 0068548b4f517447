"""`coordinator demo`: the tutorial end to end, twice in one directory, and interrupted."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support import ROOT, coordinator, process_env


def test_the_demo_ends_approved_and_notified_and_runs_again(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    first = coordinator("demo", "--data", data)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Outcome: finished approved-and-notified" in first.stdout
    assert "read_application: the product answered 200" in first.stdout
    assert "await_decision: the product said review-decision is there" in first.stdout
    assert "await_decision: read the result, as the product had said" in first.stdout
    assert "await_delivery: read the result: " in first.stdout  # Messaging is only read
    assert "at route: took case 1 -> notify" in first.stdout  # replayed from its record
    assert (
        "decisions follow from its record, signed by the key given; ended finished" in first.stdout
    )
    # The review command as printed works pasted into a fresh shell: with the stand-ins'
    # staff token before it (the interactive test below runs it so).
    [review] = [line for line in first.stdout.splitlines() if "coordinator review " in line]
    assert review.strip().startswith("$ STANDIN_STAFF_TOKEN=demo-staff-token coordinator"), review
    # The printed history: every event numbered in order, in the order the run took them
    # (how often Messaging was read before the notice was delivered is the clock's).
    lines = first.stdout.splitlines()
    timeline = [line.split() for line in lines if re.match(r"\S+Z +#\d+ ", line)]
    assert [int(words[1][1:]) for words in timeline] == list(range(1, len(timeline) + 1))
    kinds = [(words[2], words[3]) for words in timeline if words[2] != "result-polled"]
    assert kinds == [
        ("admitted", "read_application"),
        *[(k, "read_application") for k in ("call-dispatched", "call-answered")],
        ("step-completed", "read_application"),
        *[(k, "request_review") for k in ("call-dispatched", "call-answered")],
        ("step-completed", "request_review"),
        *[(k, "await_decision") for k in ("waiting", "result-delivered", "result-read")],
        ("step-completed", "await_decision"),
        ("step-completed", "route"),
        *[(k, "notify") for k in ("call-dispatched", "call-answered", "step-completed")],
        *[(k, "await_delivery") for k in ("waiting", "result-read", "step-completed")],
        ("step-completed", "delivered"),
        ("finished", "approved"),
    ], first.stdout
    second = coordinator("demo", "--data", data)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "Outcome: finished approved-and-notified" in second.stdout
    assert not (data / "pgdata" / "postmaster.pid").exists()  # PostgreSQL was stopped


def _demo(data: Path, *flags: str) -> subprocess.Popen[str]:
    """``coordinator demo`` in ``data``, its output (both streams) to read line by line."""
    return subprocess.Popen(
        [sys.executable, "-m", "registry_coordinator", "demo", "--data", str(data), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=process_env(),
    )


def test_interactive_demo_waits_for_the_reviewer_and_ctrl_c_stops_everything(
    tmp_path: Path,
) -> None:
    data = tmp_path / "demo"
    demo = _demo(data, "--interactive", "--keep-running")
    assert demo.stdout is not None
    lines: list[str] = []
    url = None
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = demo.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
            if "ready at " in line:
                url = line.split("ready at ")[1].strip()
            if "In another terminal" in line:
                printed = demo.stdout.readline()
                lines.append(printed)
                # $ NAME=TOKEN coordinator review ID approve ...: as a caseworker types it.
                words = printed.split("coordinator ", 1)[1].split()
                name, token = printed.strip().split()[1].split("=", 1)
                review = subprocess.run(
                    [sys.executable, "-m", "registry_coordinator", *words],
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                    env={**process_env(), name: token},
                    check=False,
                )
                assert review.returncode == 0, review.stderr
            if "Still running" in line:
                lines.append(demo.stdout.readline())
                break
        else:
            raise AssertionError("".join(lines))
        assert any("Outcome: finished approved-and-notified" in line for line in lines)
        assert url is not None
        assert httpx.get(f"{url}/health").status_code == 200
        console = f"{url}/console/"
        assert f"the operator console: {console} (sign in as ada" in lines[-1]
        # Opening it sends the browser to sign in at the stand-in issuer, whose page offers ada.
        sign_in = httpx.get(console, follow_redirects=True)
        assert sign_in.status_code == 200
        assert "Sign in as ada" in sign_in.text
        demo.send_signal(signal.SIGINT)
        assert demo.wait(60) == 130
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
        demo.stdout.close()
    try:
        httpx.get(f"{url}/health", timeout=2)
        raise AssertionError("the service still answers after Ctrl-C")
    except httpx.TransportError:
        pass
    assert not (data / "pgdata" / "postmaster.pid").exists()


def test_sigterm_stops_the_demo_and_everything_it_started(tmp_path: Path) -> None:
    """As a supervisor or `timeout` stops it: the service, its PostgreSQL and the stand-ins
    go with the demo, as they do on Ctrl-C."""
    data = tmp_path / "demo"
    demo = _demo(data, "--keep-running")
    assert demo.stdout is not None
    lines: list[str] = []
    url = None
    try:
        while not lines or "Still running" not in lines[-1]:
            line = demo.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
            if "ready at " in line:
                url = line.split("ready at ")[1].strip()
        assert url is not None and httpx.get(f"{url}/health").status_code == 200
        printed = "".join(lines)
        ports = re.findall(r"--product=\w+=(\d+)", printed) + re.findall(r"--issuer=(\d+)", printed)
        assert len(ports) == 4, printed
        products = [f"http://127.0.0.1:{port}/" for port in ports]
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(60) == 143, "".join(lines)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
        demo.stdout.close()
    for address in [f"{url}/health", *products]:
        try:
            httpx.get(address, timeout=2)
            raise AssertionError(f"{address} still answers after SIGTERM")
        except httpx.TransportError:
            pass
    assert not (data / "pgdata" / "postmaster.pid").exists()
