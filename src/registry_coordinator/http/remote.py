"""The remote CLI's client: ``coordinator runs``, ``admission``, ``connections``,
``bulk``, ``approvals`` and ``erase`` over HTTP.

:mod:`registry_coordinator.cli.remote` parses these commands (the layers: the command
line may import this module, never the reverse); this module turns one into its request,
sends it, and says what came back, as text for people or the service's JSON as it is.
Exit codes: 0 done, 1 refused by the service (a 4xx problem), 2 usage, 3 the
service is unavailable (no connection, or a 5xx).
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.errors import ExitCode


def run(args: argparse.Namespace) -> int:
    """Send the command ``args`` names, as :mod:`registry_coordinator.cli.remote` parsed
    it, and print the service's answer; the exit code."""
    headers = {}
    if args.token_file is not None:
        try:
            token = Path(args.token_file).read_text("ascii").strip()
        except OSError as exc:
            print(f"coordinator: cannot read the token file: {exc.strerror}", file=sys.stderr)
            return ExitCode.USAGE
        except UnicodeDecodeError:
            print(
                f"coordinator: {args.token_file} does not hold a token (a JWT is ASCII text)",
                file=sys.stderr,
            )
            return ExitCode.USAGE
        headers["Authorization"] = f"Bearer {token}"
    parts = urlsplit(args.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        print(
            f"coordinator: --url {args.url!r} is not the service's http or https URL, "
            "e.g. http://127.0.0.1:8080",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    try:
        request = _request(args)
    except ValueError as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    method, path, body, params, extra = request
    try:
        with httpx.Client(base_url=args.url, headers=headers, timeout=30) as client:
            response = client.request(method, path, json=body, params=params, headers=extra)
    except httpx.HTTPError as exc:
        print(f"coordinator: {args.url} is unavailable: {exc}", file=sys.stderr)
        return ExitCode.UNAVAILABLE
    try:
        answer = response.json()
    except ValueError:
        answer = {"detail": response.text}
    if response.status_code >= 400:
        code = answer.get("code", "unknown") if isinstance(answer, dict) else "unknown"
        detail = answer.get("detail", "") if isinstance(answer, dict) else ""
        if args.format == "json":
            print(json.dumps(answer, indent=2))
        print(f"coordinator: refused ({response.status_code} {code}): {detail}", file=sys.stderr)
        # Held admission is an operator's refusal, not an outage, whatever its status.
        unavailable = response.status_code >= 500 and code != "admission.held"
        return ExitCode.UNAVAILABLE if unavailable else ExitCode.INVALID
    if args.format == "json":
        print(json.dumps(answer, indent=2))
    else:
        print(_text(args, answer, extra))
    return ExitCode.OK


def _request(args: argparse.Namespace) -> tuple[str, str, JSON, dict[str, Any], dict[str, str]]:
    """The HTTP request a command makes: method, path, body, query and headers."""
    if args.command == "admission":
        asked: dict[str, JSON] = {"reason": args.reason}
        if args.workflow:
            asked["workflow"] = args.workflow
        return "POST", f"/v1/admission/{args.action}", asked, {}, {}
    if args.command == "erase":
        return "POST", "/v1/erasures", {"subject": args.subject, "reason": args.reason}, {}, {}
    if args.command == "connections":
        if args.action == "list":
            return "GET", "/v1/connections", None, {}, {}
        path = f"/v1/connections/{quote(args.connection, safe='')}/{args.action}"
        return "POST", path, {"reason": args.reason}, {}, {}
    if args.command == "bulk":
        return _bulk(args)
    if args.command == "approvals":
        if args.action == "list":
            return "GET", "/v1/approvals", None, {}, {}
        path = f"/v1/approvals/{quote(args.approval, safe='')}/{args.action}"
        return "POST", path, {"reason": args.reason}, {}, {}
    action = args.action
    if action == "start":
        text = args.input
        if text.startswith("@"):
            try:
                text = Path(text[1:]).read_text()
            except OSError as exc:
                raise ValueError(f"cannot read {text[1:]}: {exc.strerror}") from None
        try:
            run_input = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"--input is not JSON: {exc}") from None
        body = {"workflow": args.workflow, "input": run_input}
        if args.version:
            body["version"] = args.version
        key = args.key or uuid.uuid4().hex
        return "POST", "/v1/runs", body, {}, {"Idempotency-Key": key}
    if action == "list":
        params: dict[str, Any] = {"limit": args.limit}
        if args.field:
            params["field"] = args.field
        params.update(
            {
                k: v
                for k, v in (
                    ("state", args.state),
                    ("workflow", args.workflow),
                    ("cursor", args.cursor),
                    ("archived", "true" if args.archived else None),
                )
                if v
            }
        )
        return "GET", "/v1/runs", None, params, {}
    if action == "status":
        return "GET", f"/v1/runs/{args.run}", None, {}, {}
    if action == "history":
        return "GET", f"/v1/runs/{args.run}/history", None, {}, {}
    said: dict[str, JSON] = {"reason": args.reason}
    for field in ("attestation", "binding"):
        if getattr(args, field, None):
            said[field] = getattr(args, field)
    return "POST", f"/v1/runs/{args.run}/{action}", said, {}, {}


def _bulk(args: argparse.Namespace) -> tuple[str, str, JSON, dict[str, Any], dict[str, str]]:
    """A ``bulk`` command's request."""
    if args.action == "list":
        return "GET", "/v1/bulk-jobs", None, {}, {}
    if args.action == "preview":
        given = {
            "workflow": args.workflow,
            "version": args.version,
            "state": args.state,
            "holdCode": args.hold_code,
            "connection": args.connection,
            "admittedAfter": args.admitted_after,
            "admittedBefore": args.admitted_before,
            "fields": args.field,
        }
        body: dict[str, JSON] = {
            "action": args.action_name,
            "filter": {k: v for k, v in given.items() if v},
        }
        if args.per_second is not None:
            body["perSecond"] = args.per_second
        return "POST", "/v1/bulk-jobs", body, {}, {}
    path = f"/v1/bulk-jobs/{quote(args.job, safe='')}"
    if args.action == "show":
        return "GET", path, None, {}, {}
    return "POST", f"{path}/{args.action}", {"reason": args.reason}, {}, {}


def _job(job: JSON) -> str:
    """A bulk job in a line or two."""
    runs = job["runs"]
    return (
        f"bulk job {job['id']}  {job['action']}  {job['state']}  {runs['total']} runs: "
        f"{runs['acted']} acted, {runs['pending']} to go, {runs['changed']} changed, "
        f"{runs['refused']} refused, {runs['unconfirmed']} unconfirmed"
    )


def _bulk_text(args: argparse.Namespace, answer: JSON) -> str:
    if args.action == "list":
        return "\n".join(_job(j) for j in answer["jobs"]) or "no bulk jobs"
    text = _job(answer)
    if args.action == "preview":
        sample = "\n".join(
            f"  {r['id']}  {r['state']}  {r['workflow']['id']}" for r in answer["sample"]
        )
        return (
            f"{text}\n{sample}\nnothing is done until it is started: coordinator bulk start "
            f"{answer['id']} --reason ..."
        )
    if args.action == "show":
        lines = [text]
        lines += [
            f"  {e['at']}  {e['kind']} by {e['by']}" + (f": {e['reason']}" if e["reason"] else "")
            for e in answer["events"]
        ]
        lines += [
            f"  not acted on: {r['run']}  {r['outcome']}  {r['code'] or ''}"
            for r in answer["notActedOn"]
        ]
        return "\n".join(lines)
    return text


def _connections(args: argparse.Namespace, answer: JSON) -> str:
    if args.action == "list":
        return "\n".join(
            f"{c['name']}  {c['product']}  "
            + (
                "not paused"
                if c["paused"] is None
                else f"paused since {c['paused']['since']} by {c['paused']['by']}: "
                f"{c['paused']['reason']}"
            )
            for c in answer["connections"]
        )
    if args.action == "pause":
        return f"connection {answer['name']} paused: no call is sent over it until it is resumed"
    if not answer["wasPaused"]:
        return f"connection {answer['name']} was not paused: nothing changed"
    return f"connection {answer['name']} resumed: {answer['runs']} runs that waited for it go on"


def _approval(approval: JSON) -> str:
    return (
        f"approval {approval['id']}  {approval['state']}  {approval['action']} of run "
        f"{approval['run']}, asked by {approval['requestedBy']} at {approval['requestedAt']}: "
        f"{approval['reason']}"
    )


def _text(args: argparse.Namespace, answer: JSON, headers: dict[str, str]) -> str:
    if args.command == "bulk":
        return _bulk_text(args, answer)
    if args.command == "approvals":
        if args.action == "list":
            return "\n".join(_approval(a) for a in answer["approvals"]) or "nothing waits"
        return _approval(answer["approval"])
    if "approval" in answer and args.command == "runs":
        return (
            _approval(answer["approval"]) + "\nnothing is done until another operator approves it"
        )
    if args.command == "connections":
        return _connections(args, answer)
    if args.command == "admission":
        which = "admission" if answer["workflow"] is None else f"starts of {answer['workflow']}"
        return f"{which} {'held' if answer['held'] else 'released'}: {answer['reason']}"
    if args.command == "erase":
        when = f"at {answer['erasedAt']} by {answer['erasedBy']}"
        if answer["before"]:
            return (
                f"the subject's data key {answer['key']} was erased before, {when}: nothing changed"
            )
        return (
            f"erased the subject's data key {answer['key']} {when}: what {answer['runs']} runs "
            "held of the subject is unreadable now, in the database and in every bundle"
        )
    if args.action == "list":
        lines = [
            f"{r['id']}  {r['state']:<9}  {r['workflow']['id']}  ended {r['endedAt']}"
            f"  archived to {r['archived']['bundle']}"
            if "archived" in r
            else f"{r['id']}  {r['state']:<9}  {r['workflow']['id']}@{r['workflow']['version']}"
            f"  {r['step']}  {r['admittedAt']}"
            for r in answer["runs"]
        ]
        if answer.get("next"):
            lines.append(f"more: --cursor {answer['next']}")
        return "\n".join(lines) if lines else "no runs"
    if args.action == "history":
        return describe_history(answer["events"])
    text = describe_status(answer)
    if args.action == "start":
        text += f"\n  idempotency key {headers['Idempotency-Key']}"
    return text


def describe_status(run: JSON) -> str:
    """A run's status as a few readable lines."""
    workflow = run["workflow"]
    lines = [
        f"run {run['id']}",
        f"  workflow  {workflow['id']} version {workflow['version']} ({workflow['digest']})",
        f"  state     {run['state']} at step {run['step']}",
    ]
    if run.get("outcome"):
        lines.append(f"  outcome   {run['outcome']}")
    if run.get("output") is not None:
        lines.append(f"  output    {json.dumps(run['output'])}")
    for name in ("failure", "hold"):
        if run.get(name):
            lines.append(f"  {name:<9} {run[name]['code']}: {run[name]['detail']}")
    lines.append(f"  admitted  {run['admittedAt']}, deadline {run['deadlineAt']}")
    if run.get("endedAt"):
        lines.append(f"  ended     {run['endedAt']}")
    if run.get("head"):
        lines.append(f"  head      {run['head']} (its history's hash chain)")
    return "\n".join(lines)


def describe_history(events: list[JSON]) -> str:
    """A run's history as a readable timeline."""
    # Columns as wide as their widest entry: instants drop trailing zeros, actors vary.
    at = max((len(event["at"]) for event in events), default=0)
    actor = max((len(event["actor"]) for event in events), default=0)
    lines = []
    for event in events:
        detail = event["detail"]
        note = f"  {json.dumps(detail, sort_keys=True)}" if detail else ""
        lines.append(
            f"{event['at']:<{at}}  #{event['seq']:<3} {event['kind']:<16} {event['step']:<22}"
            f" by {event['actor']:<{actor}}{note}".rstrip()
        )
    return "\n".join(lines)
