"""The shipped Grafana dashboard charts exactly the metrics the exporter exposes, and draws
the shipped alerts' thresholds."""

from __future__ import annotations

import json
import re

import yaml
from prometheus_client import CollectorRegistry, generate_latest

from collector.live.exporter import KvscopeMetrics
from collector.live.live_state import LiveState
from tests.support.live_records import HEADER, RECORDS
from tests.support.repo import REPO


def test_dashboard_charts_every_exported_metric_and_no_other() -> None:
    state = LiveState()
    state.observe(HEADER, RECORDS)
    registry = CollectorRegistry()
    registry.register(KvscopeMetrics(state))
    exposed = set(re.findall(r"^(kvscope_\w+)", generate_latest(registry).decode(), re.MULTILINE))
    dashboard = json.loads((REPO / "docs/grafana/kvscope-dashboard.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for expression in expressions for name in re.findall(r"kvscope_\w+", expression)}
    assert len(expressions) == 19
    assert len(exposed) == 15
    assert used == exposed, (used - exposed, exposed - used)


def test_threshold_lines_are_the_alerts_thresholds() -> None:
    """A panel naming an alert draws a threshold line where that alert's rule compares."""
    dashboard = json.loads((REPO / "docs/grafana/kvscope-dashboard.json").read_text())
    groups = yaml.safe_load((REPO / "docs/prometheus/kvscope-alerts.yml").read_text())["groups"]
    rules = {
        rule["alert"]: rule["expr"]
        for group in groups
        for rule in group["rules"]
        if "alert" in rule
    }
    drawn = {}
    for panel in dashboard["panels"]:
        named = re.search(r"Kvscope\w+", panel["title"])
        steps = panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
        lines = [step["value"] for step in steps if step["value"] is not None]
        if named and lines:
            drawn[named.group()] = lines
            compared = [
                float(value) for value in re.findall(r"[<>] ([\d.]+)", rules[named.group()])
            ]
            assert lines[0] in compared, (named.group(), lines, compared)
    assert sorted(drawn) == [
        "KvscopeEngineSilent",
        "KvscopeFreeBlocksLow",
        "KvscopePrefixesRecomputed",
    ]
