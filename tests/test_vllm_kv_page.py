"""The vLLM KV events page: on the sample run (none), on a run collected through vLLM's real
publisher, and on a run with lost batches and a hash conflict; in AppTest and in Chromium."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from collector.charts.theme import WALL_TITLE
from collector.live.vllm_kv_subscriber import NOT_IN_BUFFER
from collector.model.run_calendar import DAY_S
from collector.queries.vllm_kv import vllm_kv_summary
from collector.replay.block_manager import CacheSettings
from collector.store.run_file import RunStore
from collector.vllm_kv.conflicts import HashConflictDetector
from collector.vllm_kv.ingest import append_vllm_batches
from collector.vllm_kv.wire import AllBlocksCleared, Gap, KVEventBatch, ReceivedBatch
from tests.support.app import go_to, metrics, start
from tests.support.browser import (
    app_in_chromium,
    keep_screenshot,
    png_is_not_blank,
    screenshot_page,
)
from tests.support.repo import SAMPLE_RUN
from tests.support.vllm_kv_pipeline import (
    H,
    checked_sockets,
    events_run,
    received,
    replay_sample,
    stored,
)
from visualizer.charts.vllm_kv import vllm_kv_activity_figure

PAGE = "views/vllm_kv_events.py"
SETTINGS = CacheSettings(block_size=16, num_blocks=600)


@pytest.fixture(scope="module")
def collected_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 sample requests through vLLM's manager and publisher, then a cache reset."""
    path = tmp_path_factory.mktemp("collected") / "run.duckdb"
    run = events_run(path, SETTINGS)
    with checked_sockets() as sockets:
        replay_sample(sockets, run, SETTINGS, limit=120, then_reset=True)
    run.finalize()  # as the collector does when it stops
    run.close()
    return path


@pytest.fixture(scope="module")
def troubled_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Batches 1 and 2 lost for good, and batch 3 brings other tokens under batch 0's hash."""
    path = tmp_path_factory.mktemp("troubled") / "run.duckdb"
    run = events_run(path, CacheSettings(4, 5))
    gap = Gap("ipc://test", 0, 0, 1, 2, NOT_IN_BUFFER, 0)
    batches = [received(0, stored(H, [1, 2, 3, 4])), received(3, stored(H, [5, 6, 7, 8]))]
    append_vllm_batches(run, batches, [gap], HashConflictDetector())
    run.finalize()  # as the collector does when it stops
    run.close()
    return path


def open_page(run: Path) -> AppTest:
    app = go_to(start(run), PAGE)
    assert [title.value for title in app.title] == ["vLLM's KV events"]
    limits = " ".join(block.value for block in app.markdown)
    assert "kv_cache_report_mode" in limits
    assert "No allocations, frees, free-block counts or request ids" in limits
    return app


def plotted(values: list[float] | dict[str, str]) -> list[float]:
    """A trace's values from a Plotly spec (arrays travel as base64 typed arrays)."""
    if isinstance(values, list):
        return values
    raw = base64.b64decode(values["bdata"])
    return [float(value) for value in np.frombuffer(raw, dtype=values["dtype"])]


def test_the_sample_run_says_it_has_none_and_how_to_collect_them() -> None:
    app = open_page(SAMPLE_RUN)
    assert "This run has no vLLM KV events" in app.info[0].value
    text = " ".join(block.value for block in app.markdown)
    assert "--kv-events-config" in text
    assert "kvscope collect --db RUN.duckdb --vllm-kv-events tcp://ENGINE_HOST:5557" in text
    assert not app.get("plotly_chart")
    assert not app.metric


def test_a_collected_run_shows_what_vllm_sent(collected_run: Path) -> None:
    store = RunStore.open(collected_run)
    summary = vllm_kv_summary(store)
    store.close()
    assert summary["removed_blocks"] > 0 and summary["clears"] == 1
    app = open_page(collected_run)
    assert metrics(app) == {
        "Batches received": f"{summary['batches']:,}",
        "Blocks stored": f"{summary['stored_blocks']:,}",
        "Blocks removed": f"{summary['removed_blocks']:,}",
        "Cache clears": "1",
        "Batches lost": "0",
        "Resent by vLLM's replay": f"{summary['replayed_batches']:,}",
        "Hash conflicts": "0",
        "Published hashes": "64-bit",
    }
    assert app.caption[0].value.startswith("From 1 data-parallel rank(s); engine restarts seen: 0")
    successes = [block.value for block in app.success]
    assert successes[0].startswith("None: every batch arrived in order")
    assert successes[1].startswith("0: no two different blocks arrived under one hash among ")
    (chart,) = app.get("plotly_chart")
    spec = json.loads(chart.proto.spec)
    stored_bars, removed_bars = spec["data"]
    assert sum(plotted(stored_bars["y"])) == summary["stored_blocks"]
    assert -sum(plotted(removed_bars["y"])) == summary["removed_blocks"]
    assert len(spec["layout"]["shapes"]) == 1  # the cache reset


def test_lost_batches_and_conflicts_are_listed(troubled_run: Path) -> None:
    app = open_page(troubled_run)
    assert metrics(app)["Batches lost"] == "2"
    assert metrics(app)["Hash conflicts"] == "1"
    assert "2 batches never arrived" in app.warning[0].value
    assert "already had: 1." in app.error[0].value
    gaps, conflicts = (frame.value for frame in app.dataframe)
    assert gaps[["first_seq", "last_seq", "num_batches", "reason"]].values.tolist() == [
        [1, 2, 2, NOT_IN_BUFFER]
    ]
    assert conflicts[["block_hash", "differs", "first_seq", "second_seq"]].values.tolist() == [
        [f"{H:016x}", "tokens", 0, 3]
    ]


def test_the_activity_chart_stacks_stores_over_removals_and_marks_clears() -> None:
    activity = pd.DataFrame(
        {"t_s": [0.0, 1.0, 2.0], "stored": [5, 0, 2], "removed": [0, 3, 1], "cleared": [0, 1, 0]}
    )
    figure = vllm_kv_activity_figure(activity)
    stored_bars, removed_bars = figure.data
    assert list(stored_bars.y) == [5, 0, 2]
    assert list(removed_bars.y) == [0, -3, -1]
    assert [shape.x0 for shape in figure.layout.shapes] == [1.0]
    assert figure.layout.barmode == "relative"


def test_batches_over_two_days_read_on_the_wall_clock(tmp_path: Path) -> None:
    """vLLM stamps a batch with the engine's wall clock: batches over two days, a cache
    clear between, draw on a UTC date axis, the clear's line at its batch's time."""
    start_s = datetime(2026, 12, 4, 18, 0, tzinfo=UTC).timestamp()
    times = [start_s, start_s + 90_000, start_s + 2 * DAY_S]
    events = [stored(H, [1, 2, 3, 4]), AllBlocksCleared(), stored(H + 1, [5, 6, 7, 8])]
    batches = [
        ReceivedBatch("ipc://test", 0, seq, KVEventBatch(ts=ts, events=[event]), replayed=False)
        for seq, (ts, event) in enumerate(zip(times, events, strict=True))
    ]
    path = tmp_path / "run.duckdb"
    run = events_run(path, CacheSettings(4, 5))
    append_vllm_batches(run, batches, [], HashConflictDetector())
    run.finalize()
    run.close()
    app = open_page(path)
    spec = json.loads(app.get("plotly_chart")[0].proto.spec)  # the activity chart
    layout = spec["layout"]
    assert layout["xaxis"]["type"] == "date" and layout["xaxis"]["title"]["text"] == WALL_TITLE
    (clear,) = layout["shapes"]
    # the clear's bucket (60 over the two days: 48 min) starts at most a bucket before it
    early = datetime(2026, 12, 5, 19, 0) - pd.Timestamp(clear["x0"])
    assert pd.Timedelta(0) <= early < pd.Timedelta(seconds=2 * DAY_S / 60)
    bars = pd.to_datetime(spec["data"][0]["x"])
    assert bars.min() == pd.Timestamp(2026, 12, 4, 18) and bars.max().date().day == 6


@pytest.mark.slow
def test_screenshots_of_the_page(collected_run: Path, troubled_run: Path, tmp_path: Path) -> None:
    for name, run, num_charts in [
        ("sample", SAMPLE_RUN, 0),
        ("collected", collected_run, 1),
        ("troubled", troubled_run, 1),
    ]:
        with app_in_chromium(run) as (url, driver):
            # The app's entry first: a deep link as the very first request would run the
            # page file alone, before app.py's st.navigation is known to the server.
            screenshot_page(driver, url, tmp_path / f"entry_{name}.png", 0)
            path = tmp_path / f"vllm_kv_events_{name}.png"
            seen = screenshot_page(driver, f"{url}/vllm_kv_events", path, num_charts)
        assert seen["exceptions"] == [], seen
        assert seen["charts"] == num_charts, seen
        assert png_is_not_blank(path)
        keep_screenshot(path)
