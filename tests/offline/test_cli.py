"""Exit codes and output of the command line."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import jwt
import pytest
import trio

from registry_coordinator import cli
from registry_coordinator.authoring import reference
from registry_coordinator.authoring.catalog import builtin_catalog
from registry_coordinator.authoring.durations import format_duration
from registry_coordinator.cli import authoring
from registry_coordinator.cli.service import run_service
from registry_coordinator.config import DEFAULT_MAX_LIFETIME
from registry_coordinator.errors import CoordinatorError, ExitCode
from registry_coordinator.http.auth import DEVELOPMENT_AUDIENCE, DEVELOPMENT_ISSUER, jwks_path
from registry_coordinator.store.migrations import SchemaMismatch
from tests.support import CORPUS, ROOT, WORKFLOWS, coordinator, write_config


def test_usage_errors_exit_2() -> None:
    assert coordinator().returncode == 2
    assert coordinator("frobnicate").returncode == 2
    assert coordinator("check").returncode == 2
    assert coordinator("graph", WORKFLOWS / "review-application", "--format", "png").returncode == 2
    assert coordinator("package", WORKFLOWS / "review-application").returncode == 2


def test_ok_exits_0_and_refused_exits_1() -> None:
    assert coordinator("check", WORKFLOWS / "review-application").returncode == 0
    assert coordinator("check", CORPUS / "invalid" / "workflow-cycle.yaml").returncode == 1
    mixed = coordinator(
        "check", WORKFLOWS / "review-application", CORPUS / "invalid" / "workflow-cycle.yaml"
    )
    assert mixed.returncode == 1
    assert mixed.stdout.startswith("ok ")


def test_graph_mermaid() -> None:
    result = coordinator("graph", WORKFLOWS / "review-application")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "flowchart TD"
    assert "  entry(( )) --> step_read_application" in lines
    assert (
        '  step_route -->|"steps.await_decision.status == #quot;approved#quot;"| step_notify'
        in lines
    )
    assert '  step_await_decision -.->|"on-timeout"| step_not_decided' in lines
    assert '  step_delivered -->|"otherwise"| step_approved_unconfirmed_as_read' in lines


def test_graph_mermaid_names_nodes_apart_from_its_keywords_and_its_entry(tmp_path: Path) -> None:
    """Steps named ``start`` and ``end``: the first is not the entry point's node, and the
    second is not Mermaid's keyword that ends a subgraph."""
    source = (ROOT / "tests" / "workflows" / "chain.yaml").read_text()
    renamed = tmp_path / "workflow.yaml"
    renamed.write_text(
        source.replace("start: now", "start: start")
        .replace("now:", "start:")
        .replace("even_check", "end")
    )
    assert coordinator("check", renamed).returncode == 0
    lines = coordinator("graph", renamed).stdout.splitlines()
    assert "  entry(( )) --> step_start" in lines
    assert any(line.startswith("  step_end{") for line in lines), lines
    assert not any(line.split()[:1] in (["start"], ["end"]) for line in lines), lines


def test_demo_outside_the_project_says_where_the_workflows_are(tmp_path: Path) -> None:
    elsewhere = coordinator("demo", "--data", tmp_path / "data", cwd=tmp_path)
    assert elsewhere.returncode == 2
    assert "not found" in elsewhere.stderr


# Loading a configuration never connects: this DSN only has to be well formed.
OFFLINE_DSN = "postgresql://coordinator@127.0.0.1:1/coordinator"


def jwt_config(directory: Path, max_lifetime: str) -> Path:
    """A service configuration that checks the development key's tokens with this cap."""
    auth = {
        "mode": "jwt",
        "issuer": DEVELOPMENT_ISSUER,
        "audience": DEVELOPMENT_AUDIENCE,
        "jwksFile": str(directory / "signing-key.jwks.json"),
        "maxLifetime": max_lifetime,
        "policies": [],
    }
    return write_config(directory, OFFLINE_DSN, [], extra={"auth": auth})


def coordinator_token(key: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return coordinator("token", "--key", key, "--client", "case-portal", *args)


def assert_minted_nothing(result: subprocess.CompletedProcess[str], key: Path) -> str:
    """The refusal is one line, no token is printed and no key is created; the line."""
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert not key.exists() and not jwks_path(key).exists()
    return result.stderr


@pytest.mark.parametrize("auth_none", [False, True], ids=["no config", "auth mode none"])
def test_token_refuses_a_lifetime_over_the_default_cap(tmp_path: Path, auth_none: bool) -> None:
    """Without a configuration, or with one that checks no tokens, the cap is the default."""
    key = tmp_path / "signing-key.pem"
    config: list[str | Path] = (
        ["--config", write_config(tmp_path, OFFLINE_DSN, [])] if auth_none else []
    )
    result = coordinator_token(key, "--lifetime", "P2D", *config)
    assert result.returncode == 2
    line = assert_minted_nothing(result, key)
    cap = format_duration(DEFAULT_MAX_LIFETIME)
    assert "P2D" in line and cap in line and "default auth.maxLifetime" in line, line


def test_token_refuses_a_lifetime_over_its_configs_cap(tmp_path: Path) -> None:
    key = tmp_path / "signing-key.pem"
    config = jwt_config(tmp_path, "PT10M")
    result = coordinator_token(
        key, "--config", config
    )  # the default lifetime, PT15M, is too long here
    assert result.returncode == 2
    line = assert_minted_nothing(result, key)
    assert "PT15M" in line and "PT10M" in line and f"auth.maxLifetime in {config}" in line, line


def test_token_within_its_configs_cap_lives_that_long(tmp_path: Path) -> None:
    """The configured cap replaces the default one: PT2H is allowed where the file says so."""
    key = tmp_path / "signing-key.pem"
    result = coordinator_token(key, "--config", jwt_config(tmp_path, "PT2H"), "--lifetime", "PT2H")
    assert result.returncode == 0, result.stderr
    claims = jwt.decode(result.stdout.strip(), options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 2 * 3600


@pytest.mark.parametrize("lifetime", ["PT0S", "P0D", "PT0.5S", "-PT1H"])
def test_token_refuses_a_lifetime_that_is_not_positive(tmp_path: Path, lifetime: str) -> None:
    """PT0.5S too: tokens live whole seconds, so it would mint one that is already expired."""
    key = tmp_path / "signing-key.pem"
    result = coordinator_token(key, f"--lifetime={lifetime}")
    assert result.returncode == 2
    assert lifetime in assert_minted_nothing(result, key)


def test_token_with_an_invalid_config_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "signing-key.pem"
    result = coordinator_token(key, "--config", tmp_path / "missing.yaml")
    assert result.returncode == 1
    assert result.stdout == "" and "missing.yaml" in result.stderr
    assert not key.exists()


def test_token_help_names_the_cap() -> None:
    help_text = " ".join(coordinator("token", "--help").stdout.split())
    assert "auth.maxLifetime" in help_text and format_duration(DEFAULT_MAX_LIFETIME) in help_text


class Gone(CoordinatorError):
    """An error of the product's own, as a command would meet one."""

    exit_code = ExitCode.UNAVAILABLE
    summary = "things unavailable"


def test_an_error_of_the_products_own_is_one_line_and_its_exit_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def digest(_: argparse.Namespace) -> int:
        raise Gone("the thing at 127.0.0.1:1 refused the connection")

    monkeypatch.setattr(authoring, "_digest", digest)
    assert cli.main(["digest", "anything.json"]) == ExitCode.UNAVAILABLE
    assert capsys.readouterr().err == (
        "coordinator: things unavailable: the thing at 127.0.0.1:1 refused the connection\n"
    )


def test_a_service_commands_error_is_taken_out_of_trios_exception_groups() -> None:
    """Raised in a task of a nursery inside another, as ``serve`` meets its errors."""

    async def fails(error: BaseException) -> None:
        async def task() -> None:
            raise error

        async with trio.open_nursery() as outer:
            async with trio.open_nursery() as inner:
                inner.start_soon(task)
            outer.cancel_scope.cancel()

    mismatch = SchemaMismatch("run `coordinator migrate --config FILE`")
    with pytest.raises(SchemaMismatch) as caught:
        run_service(lambda: fails(mismatch))
    assert caught.value is mismatch
    with pytest.raises(ExceptionGroup):  # a defect keeps its traceback, group and all
        run_service(lambda: fails(ValueError("a defect")))


def test_migrate_without_a_database_says_so_and_exits_3(tmp_path: Path) -> None:
    result = coordinator("migrate", "--config", write_config(tmp_path, OFFLINE_DSN, []))
    assert result.returncode == ExitCode.UNAVAILABLE
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("coordinator: database unavailable: "), result.stderr


def test_catalog_lists_products_then_one_then_an_operations_schemas() -> None:
    every = coordinator("catalog")
    assert every.returncode == 0, every.stderr
    assert every.stdout.startswith(
        "breg 2026.12.1\n"
        "  connection-bound parameters (set per connection, never workflow input):\n"
        "    accessProfile: sent as query accessProfile — the BReg access profile "
    )
    assert "    submit-message: mutation POST /v1/messages, Idempotency-Key — " in every.stdout
    assert "  results (for wait-for):\n    review-decision: keyed by requestId" in every.stdout
    assert (
        "    message-delivered: keyed by id, read with read-message, final when status is "
        "cancelled, delivered, expired, failed; or report is unavailable and status is "
        "submitted; the product sends nothing: it is read on a backoff schedule — "
    ) in every.stdout
    one = coordinator("catalog", "messaging")
    assert one.stdout.startswith("messaging 2026.12.1\n") and "breg" not in one.stdout
    assert "    senderProfile: sent as body senderProfile — " in one.stdout
    op = coordinator("catalog", "messaging", "submit-message")
    assert op.returncode == 0, op.stderr
    lines = op.stdout.splitlines()
    assert lines[:6] == [
        "messaging/submit-message: Submit one message to one recipient, from a template (with "
        "its locale and data) or as direct content; accepted with 202 and queued, never yet "
        "delivered",
        "  POST /v1/messages",
        "  effect: mutation; recovery after an unknown outcome: same-command-and-receipt",
        "  Idempotency-Key: sent",
        "  sends the connection's senderProfile (body senderProfile)",
        "  receipt lookup: POST /v1/messages/receipt with the original key and body",
    ]
    assert '      "required": [' in lines  # the input schema, whole
    typo = coordinator("catalog", "mesaging")
    assert typo.returncode == 2
    assert typo.stderr == (
        "coordinator catalog: no product 'mesaging' in the catalog: did you mean messaging?\n"
    )
    missing = coordinator("catalog", "messaging", "send")
    assert missing.returncode == 2
    assert "no operation of messaging 'send'" in missing.stderr


def test_the_catalog_reference_in_the_workflow_guide_is_current() -> None:
    """docs/workflows.md holds what :func:`reference.markdown` writes from the catalog:
    a product or operation added, renamed or described anew changes the page too."""
    page = (ROOT / "docs" / "workflows.md").read_text()
    begin = page.index("-->\n", page.index("<!-- catalog: written by")) + len("-->\n")
    end = page.index("<!-- catalog: end -->")
    assert page[begin:end] == reference.markdown(builtin_catalog())
