"""The console's offline parts: its words for every hold code, the PKCE challenge, the
graph's marks, the vendored Graphviz and its pin, and the console's configuration."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import timedelta
from importlib import resources
from pathlib import Path

import pytest

from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.drawing import MARKS, dot
from registry_coordinator.authoring.workflow import Workflow
from registry_coordinator.config import load_config
from registry_coordinator.http.console import render, wording
from registry_coordinator.http.console.issuer import challenge, random_token
from registry_coordinator.http.console.render import span
from registry_coordinator.http.routes.runs import ACTIONS
from registry_coordinator.semantics.codes import HoldCode
from tests.support import ROOT, WORKFLOWS, refused


def test_every_hold_code_has_plain_words() -> None:
    assert set(wording.HOLDS) == set(HoldCode)
    for words in wording.HOLDS.values():
        assert words.title and words.known and words.advice
        assert "`" not in words.title + words.known + words.advice  # no code markup for people
    assert wording.hold("no-such-code").title == "Held: no-such-code"


def test_each_hold_offers_the_actions_that_can_help_recommended_first_cancel_last() -> None:
    for code, words in wording.HOLDS.items():
        assert words.offers[-1] == "cancel", code
        assert set(words.offers) <= set(ACTIONS) and len(set(words.offers)) == len(words.offers)
        first = {"retry-same": "retry", "reconcile": "reconcile", "cancel": "cancel"}
        assert first[words.offers[0]] in words.advice.lower(), code  # the advice's first
    # The product refused the request: it did not act, so it has no receipt to reconcile on.
    assert "reconcile" not in wording.HOLDS[HoldCode.PRODUCT_FORBIDDEN].offers
    assert wording.HOLDS[HoldCode.RECEIPT_EXPIRED].offers == ("cancel",)


def test_every_action_on_a_run_has_words() -> None:
    assert set(wording.ACTIONS) == set(ACTIONS)


def test_the_pkce_challenge_is_rfc_7636_appendix_b() -> None:
    verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    assert challenge(verifier) == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


def test_fresh_tokens_are_distinct_valid_pkce_verifiers() -> None:
    tokens = {random_token() for _ in range(100)}
    assert len(tokens) == 100
    for token in tokens:  # RFC 7636 §4.1: 43 to 128 unreserved characters
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", token)
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", challenge(token))


def _workflow() -> Workflow:
    checked = check_source(WORKFLOWS / "review-application")
    assert checked.definition is not None, checked.diagnostics
    return checked.definition.workflow


def test_the_graph_marks_the_path_and_the_current_step() -> None:
    workflow = _workflow()
    drawn = dot(workflow, {"read_application": "taken", "request_review": "current"})
    lines = {line.split()[0].strip('"'): line for line in drawn.splitlines() if "[shape" in line}
    assert lines.pop("__start") == "  __start [shape=point];"
    assert all(line.startswith('  "') for line in lines.values())  # any step id is quoted
    assert 'class="taken"' in lines["read_application"]
    assert 'class="current"' in lines["request_review"]
    assert 'id="step-route"' in lines["route"] and "class=" not in lines["route"]
    with pytest.raises(AssertionError):
        dot(workflow, {"route": "red"})
    assert {"taken", "current"} == MARKS


def test_the_vendored_graphviz_is_the_pinned_file() -> None:
    static = resources.files("registry_coordinator.http.console").joinpath("static")
    pins = json.loads(static.joinpath("vendor.json").read_text())
    for name, pin in pins.items():
        content = static.joinpath(name).read_bytes()
        assert hashlib.sha256(content).hexdigest() == pin["sha256"], name
        assert pin["version"] in content[:200].decode()
    assert set(pins) == {n for n in render.assets() if n.startswith("vendor/")}


def test_assets_are_served_only_under_their_version() -> None:
    version = render.asset_version()
    assert render.asset_url("console.css") == f"/console/assets/{version}/console.css"
    assert "vendor.json" not in render.assets()  # the pin is not served
    with pytest.raises(KeyError):
        render.asset_url("missing.js")


def test_no_template_has_inline_script_or_style() -> None:
    templates = Path(render.__file__).parent / "templates"
    for page in templates.glob("*.html"):
        text = page.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), page.name
        assert not re.search(r"\sstyle=|<style|\son[a-z]+=", text), page.name


def _config(tmp_path: Path, console: str, auth: str = "auth: {mode: none}") -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        f"database: {{embedded: {{dataDirectory: d}}}}\nworkflows: []\n{auth}\n{console}"
    )
    return path


def test_the_console_section(tmp_path: Path) -> None:
    jwt = (
        "auth: {mode: jwt, issuer: 'https://idp', audience: a, jwksFile: j.json, "
        "policies: [{client: ops, scopes: [s.operate], operator: true}]}"
    )
    config = load_config(_config(tmp_path, "console: {clientId: rc}", jwt)).console
    assert (config.client_id, config.public_url, config.scopes) == (
        "rc",
        None,
        ("openid", "s.operate"),
    )
    named = load_config(
        _config(
            tmp_path, "console: {clientId: rc, publicUrl: 'https://c.example/', scopes: [x]}", jwt
        )
    ).console
    assert (named.public_url, named.scopes) == ("https://c.example", ("openid", "x"))
    assert load_config(_config(tmp_path, "console: {clientId: rc}")).console.client_id is None
    assert refused(_config(tmp_path, "console: {publicUrl: 'http://c.example'}", jwt)) == [
        ("config.invalid-value", 4)
    ]
    assert refused(_config(tmp_path, "console: {publicUrl: 'https://c.example/console'}", jwt)) == [
        ("config.invalid-value", 4)
    ]
    assert refused(_config(tmp_path, "console: {clientid: rc}", jwt)) == [("field.unknown", 4)]


def test_the_example_configuration_documents_the_console() -> None:
    text = (ROOT / "config" / "coordinator.example.yaml").read_text()
    for field in ("clientId", "publicUrl", "scopes"):
        assert re.search(rf"^\s+#?\s*{field}:", text, re.MULTILINE), field


def test_a_duration_reads_in_its_two_largest_units() -> None:
    assert [span(timedelta(seconds=s)) for s in (0.0123, 0.5, 12.34, 61, 3725, 90061)] == [
        "12 ms",
        "500 ms",
        "12.3 s",
        "1 min 1 s",
        "1 h 2 min",
        "1 d 1 h",
    ]
    assert span(None) == "—"
