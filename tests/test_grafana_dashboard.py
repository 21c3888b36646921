"""The shipped Grafana dashboard charts exactly the metrics the exporter exposes."""

from __future__ import annotations

import json
import re

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
    assert len(expressions) == 13
    assert len(exposed) == 11
    assert used == exposed, (used - exposed, exposed - used)
