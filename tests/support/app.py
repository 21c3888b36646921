"""Start the app on a run with Streamlit's AppTest, and open one of its pages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamlit.testing.v1 import AppTest

from tests.support.repo import REPO, SAMPLE_RUN


def start(run: Path = SAMPLE_RUN, timeout_s: float = 60, **session: Any) -> AppTest:
    """The app on `run` (and these session values), its first page run without an exception."""
    app = AppTest.from_file(str(REPO / "visualizer" / "app.py"), default_timeout=timeout_s)
    app.session_state["run_path"] = str(run)
    for key, value in session.items():
        app.session_state[key] = value
    app.run()
    assert not app.exception, app.exception
    return app


def go_to(app: AppTest, page: str) -> AppTest:
    app.switch_page(page)
    app.run()
    assert not app.exception, app.exception
    return app


def metrics(app: AppTest) -> dict[str, str]:
    """The page's metrics, label -> value as shown."""
    return {metric.label: metric.value for metric in app.metric}
