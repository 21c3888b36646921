"""The shipped Grafana dashboard queries only metrics the exporter really exposes."""

from __future__ import annotations

import json
import re

from prometheus_client import CollectorRegistry, generate_latest

from collector.exporter import KvscopeMetrics
from collector.live_state import LiveState
from tests.conftest import REPO
from tests.test_exporter import HEADER, RECORDS


def test_dashboard_uses_only_exported_metric_names() -> None:
    state = LiveState()
    state.observe(HEADER, RECORDS)
    registry = CollectorRegistry()
    registry.register(KvscopeMetrics(state))
    exposed = set(re.findall(r"^(kvscope_\w+)", generate_latest(registry).decode(), re.MULTILINE))
    dashboard = json.loads((REPO / "docs/grafana/kvscope-dashboard.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for expression in expressions for name in re.findall(r"kvscope_\w+", expression)}
    assert len(expressions) >= 9
    assert used, "the dashboard queries kvscope metrics"
    assert used <= exposed, used - exposed
