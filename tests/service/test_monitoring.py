"""The monitoring kit in config/: the Prometheus alerting rules and the Grafana dashboard.

Every expression in them is read by a real PromQL parser (Prometheus's grammar), and
every metric it names must be one a running service declares on /metrics: a rule that
names a metric nobody exports never fires, which no one notices until the outage it was
for. Every alert must also say how bad it is, what happened, and where its runbook is in
docs/operations.md; and the dashboard must show every metric the service declares.
Prometheus's own rule engine (Debian's ``promtool``) checks the rules and runs their unit
tests, ``alerts.test.yaml``: each alert fires on the series it is for, with its labels and
words, and stays quiet before its ``for`` and where all is well.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import defaultdict
from typing import Any

import promql_parser
import yaml

from tests.support import ROOT, Services

RULES = ROOT / "config" / "prometheus" / "alerts.yaml"
RULE_TESTS = RULES.with_name("alerts.test.yaml")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
DASHBOARD = ROOT / "config" / "grafana" / "registry-coordinator.json"
OPERATIONS = ROOT / "docs" / "operations.md"
RUNBOOK = "docs/operations.md#"
SEVERITIES = {"critical", "warning"}
#: Series Prometheus writes itself for every target it scrapes, not the service.
PROMETHEUS_OWN = {"up"}
#: Grafana's own variables that stand for a range; any other variable must sit inside a
#: label matcher's quotes, where it is a string to the parser.
GRAFANA_RANGES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
#: How Grafana asks for a variable's values: label_values(SELECTOR, LABEL).
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*\w+\)$")
#: The series a histogram is exported as, each named after its family.
HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")


def alerts() -> list[dict[str, Any]]:
    """Every rule of the rules file, which must have the rule-file shape: groups of rules."""
    document = yaml.safe_load(RULES.read_text())
    assert set(document) == {"groups"}, document.keys()
    rules: list[dict[str, Any]] = []
    for group in document["groups"]:
        assert isinstance(group["name"], str) and group["rules"], group
        rules.extend(group["rules"])
    return rules


def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def expressions() -> list[tuple[str, str]]:
    """Each PromQL expression of the rules and the dashboard, with where it is."""
    found = [(f"alert {rule['alert']}", str(rule["expr"])) for rule in alerts()]
    board = dashboard()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found.append((f"panel {panel['id']} {target['refId']}", str(target["expr"])))
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = LABEL_VALUES.match(variable["query"]["query"])
            assert query is not None, variable
            found.append((f"variable {variable['name']}", query["selector"]))
    return found


def metric_names(expression: str) -> set[str]:
    """The metric names an expression selects, read from its syntax tree."""
    for variable, stands_for in GRAFANA_RANGES.items():
        expression = expression.replace(variable, stands_for)
    names: set[str] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            by_matcher = [
                m.value
                for m in node.matchers.matchers
                if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal
            ]
            name = node.name or (by_matcher[0] if by_matcher else None)
            assert name is not None, f"{node} does not name one metric"
            names.add(name)

    promql_parser.walk(promql_parser.parse(expression), visit)
    return names


def declared(exposition: str) -> dict[str, str]:
    """Each metric family /metrics declares (its ``# TYPE`` line), and its type."""
    families = {}
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            families[name] = kind
    return families


def family(name: str, families: dict[str, str]) -> str | None:
    """The declared family a series name belongs to: itself, or the histogram it is a
    bucket, count or sum of."""
    if name in families:
        return name
    for suffix in HISTOGRAM_SERIES:
        base = name.removesuffix(suffix)
        if base != name and families.get(base) == "histogram":
            return base
    return None


def anchors(markdown: str) -> list[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation but ``-``
    and ``_`` dropped, spaces made hyphens, ``-1``, ``-2``... after a repeated one."""
    found: list[str] = []
    times: dict[str, int] = defaultdict(int)
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = re.match(r"^#{1,6} (.+)$", line)
        if heading is None or fenced:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
        found.append(f"{slug}-{times[slug]}" if times[slug] else slug)
        times[slug] += 1
    return found


def promtool(*args: str) -> str:
    """What Prometheus's promtool printed, having succeeded."""
    done = subprocess.run(
        [PROMTOOL, *args], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_prometheus_checks_the_rules_and_their_unit_tests_pass() -> None:
    assert f"SUCCESS: {len(alerts())} rules found" in promtool("check", "rules", str(RULES))
    assert "SUCCESS" in promtool("test", "rules", str(RULE_TESTS))
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    tested_alerts = {case["alertname"] for test in tests for case in test["alert_rule_test"]}
    assert tested_alerts == {rule["alert"] for rule in alerts()}  # every alert has a test
    firing = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert firing == tested_alerts  # and every one is seen to fire


def test_every_alert_says_how_bad_what_happened_and_where_its_runbook_is() -> None:
    page = OPERATIONS.read_text()
    headings = anchors(page)
    # The same rule makes the anchors the page links to itself with.
    for link in re.findall(r"\]\(#([^)]+)\)", page):
        assert link in headings, f"docs/operations.md links to #{link}, no such heading"
    rules = alerts()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), names
    for rule in rules:
        promql_parser.parse(rule["expr"])  # raises ValueError where it is not PromQL
        promql_parser.parse_duration(rule["for"])
        assert rule["labels"]["severity"] in SEVERITIES, rule
        notes = rule["annotations"]
        assert notes["summary"].strip() and notes["description"].strip(), rule
        runbook = notes["runbook_url"]
        assert runbook.startswith(RUNBOOK), rule
        anchor = runbook.removeprefix(RUNBOOK)
        assert anchor in headings, f"{rule['alert']}: no heading #{anchor} in operations.md"
    assert len(rules) >= 10, names


def test_the_dashboard_takes_its_prometheus_as_a_variable_and_titles_every_panel() -> None:
    board = dashboard()
    assert board["uid"] == "registry-coordinator" and board["schemaVersion"] >= 39
    source = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    ids = [panel["id"] for panel in board["panels"]]
    assert ids == list(range(1, len(ids) + 1)), ids  # stable: in order, none reused
    for panel in board["panels"]:
        assert panel["title"].strip(), panel
        where = panel["gridPos"]
        assert where["x"] + where["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["description"].strip() and panel["datasource"] == source, panel["title"]
        references = [target["refId"] for target in panel["targets"]]
        assert references and len(references) == len(set(references)), panel["title"]
        assert all(target["datasource"] == source for target in panel["targets"])


def test_every_metric_the_rules_and_the_dashboard_name_is_on_metrics(
    services: Services,
) -> None:
    service = services(["timed-choice"])
    response = service.http.get("/metrics")
    assert response.status_code == 200
    families = declared(response.text)
    named: dict[str, list[str]] = defaultdict(list)
    shown: set[str] = set()
    for where, expression in expressions():
        for name in metric_names(expression):
            named[name].append(where)
            if where.startswith(("panel", "variable")):
                shown.add(family(name, families) or name)
    assert {"coordinator_held_runs", "up"} <= set(named)
    missing = {
        name: places
        for name, places in sorted(named.items())
        if name not in PROMETHEUS_OWN and family(name, families) is None
    }
    assert not missing, f"named but not on /metrics: {missing}"
    # The dashboard shows everything the service declares (the _created gauges are the
    # client library's start times of its counters and histograms).
    unshown = {
        name
        for name in families
        if name.startswith("coordinator_") and not name.endswith("_created")
    } - shown
    assert not unshown, f"on /metrics but on no panel: {sorted(unshown)}"
