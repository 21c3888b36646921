"""History in the app: a run whose trace spans three days, replayed at its arrival times
through vLLM's scheduler, read by day (the sidebar's day picker), the Overview's today
against yesterday, and the markers where an engine (re)started with another pool."""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from collector.advisor.suggestion import TIME_TITLE
from collector.charts.theme import WALL_HOVER, WALL_TITLE
from collector.model.run_calendar import DAY_BEFORE, DAY_S, LAST_DAY, WHOLE_RUN, RunCalendar
from collector.model.time_window import TimeGrid
from collector.queries.fleet import engine_starts
from collector.queries.timeline import run_calendar
from collector.queries.window_comparison import compared_figures
from collector.replay.block_manager import CacheSettings
from collector.replay.workload import WorkloadShape, generate
from collector.store.run_file import RunConfig, RunFile, RunStore
from engine_hooks import Event
from tests.support.app import go_to, metrics, start
from tests.support.block_manager import sample_engine_steps, tiny_run
from tests.support.browser import (
    app_in_chromium,
    keep_screenshot,
    png_is_not_blank,
    screenshot_page,
    texts,
)
from tests.support.fleet import BLOCK_SIZE, family_trace
from visualizer.day_comparison import comparison_table
from visualizer.engine_markers import engine_markers

pytestmark = pytest.mark.vllm  # replays through vLLM's own scheduler

NS = 1_000_000_000
SIDEBAR = "[data-testid='stSidebar']"
SHAPE = WorkloadShape(duration_s=3 * DAY_S, num_chats=20, num_rag_requests=80, num_reports=20)


@pytest.fixture(scope="module")
def three_days(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated workload's requests arriving over three days, replayed at their
    arrival times (vLLM's scheduler on a modelled clock: seconds of wall time)."""
    directory = tmp_path_factory.mktemp("three_days")
    rows = generate(SHAPE)
    return Path(tiny_run(directory, rows, block_size=16, num_blocks=200, timing="scheduler"))


def _requests_between(run: RunFile, start_ns: int, end_ns: int) -> int:
    row = run.row(
        "SELECT count(*) FROM events WHERE kind = 'lookup' AND NOT preempted "
        "AND ts_ns >= $start AND ts_ns < $end",
        {"start": start_ns, "end": end_ns},
    )
    assert row is not None
    return int(row[0])


def test_a_three_day_grid_offers_its_days_snapped_to_buckets() -> None:
    bucket_ns = 500 * NS
    grid = TimeGrid(0, int(3 * DAY_S * NS) - 1, bucket_ns, 1)
    calendar = RunCalendar(grid, datetime(2026, 12, 4, 18, 0))
    ranges = calendar.ranges()
    days = [label for label in ranges if label not in (WHOLE_RUN, LAST_DAY, DAY_BEFORE)]
    assert days == ["Fri 04 Dec 2026", "Sat 05 Dec 2026", "Sun 06 Dec 2026", "Mon 07 Dec 2026"]
    assert ranges[WHOLE_RUN] == (0.0, grid.span_s)
    start, end = ranges["Sat 05 Dec 2026"]  # 6 h after the start, to 30 h after it
    assert (start, end) == (22_000.0, 108_000.0)  # 500 s buckets inside the day
    last, before = ranges[LAST_DAY], ranges[DAY_BEFORE]
    assert last[1] == grid.span_s and before[1] == last[0]
    assert last[1] - last[0] == before[1] - before[0] == 86_500.0  # 173 buckets
    pair = calendar.before(grid.whole_run())
    assert pair is not None
    today, yesterday = pair
    assert (today.start_s, today.end_s) == last and (yesterday.start_s, yesterday.end_s) == before
    # the grid ends with its last whole bucket: 259,500 s, 300 s past the third day
    assert calendar.span_words(*last) == "Sun 06 Dec 18:03 to Mon 07 Dec 18:05 UTC"


def test_a_short_run_has_no_days_and_says_why_there_is_no_comparison() -> None:
    app = start()
    assert "time_range_days" not in [box.key for box in app.sidebar.selectbox]
    (line,) = [c.value for c in app.caption if c.value.startswith("Today against yesterday")]
    assert "not shown, the run spans 0.1 h and the comparison needs more than a day" in line


def test_the_day_picker_selects_that_days_records(three_days: Path) -> None:
    with RunFile.open(three_days) as run:
        calendar = run_calendar(run)
        grid = calendar.grid
        ranges = calendar.ranges()
    assert calendar.is_multi_day and 3 * DAY_S - 3600 < grid.span_s <= 3 * DAY_S + 3600
    second_day = list(ranges)[4]  # the whole run, the last 24 h, the 24 h before, day 1, day 2
    midnight = datetime.combine(calendar.started_at.date() + timedelta(days=1), datetime.min.time())
    assert second_day == f"{midnight:%a %d %b %Y}"
    app = start(three_days)
    app.selectbox(key="time_range_days").set_value(second_day).run()
    assert not app.exception, app.exception
    start_s, end_s = app.slider(key="time_range").value
    assert (start_s, end_s) == ranges[second_day]
    # whole buckets inside the day: at most one bucket short at either end
    assert 0 <= (calendar.wall(start_s) - midnight).total_seconds() < grid.bucket_s
    assert 0 <= DAY_S - (calendar.wall(end_s) - midnight).total_seconds() < grid.bucket_s
    window = grid.window(start_s, end_s)
    with RunFile.open(three_days) as run:
        requests = _requests_between(run, window.start_ns, window.end_ns)
    assert requests > 0 and metrics(app)["Requests"] == f"{requests:,}"
    assert f"{midnight:%a %d %b}" in app.sidebar.caption[0].value
    # The slider moved by hand: the picker says so.
    app.slider(key="time_range").set_range(0.0, grid.bucket_s * 10).run()
    assert app.selectbox(key="time_range_days").value == "a range of your own"


# Each page's charts over the run's time, at the least (a page may draw more: the Overview
# its integrity chart when something went wrong).
TIME_CHART_PAGES = {
    "views/overview.py": 4,
    "views/hotspots.py": 1,
    "views/collisions.py": 1,
    "views/roi.py": 1,
    "views/free_blocks.py": 1,  # last: its table is looked at after the loop
}


def _time_charts(app: AppTest) -> list[dict[str, Any]]:
    """The page's charts whose x axis is time, in seconds or on the wall clock: their specs."""
    specs = [json.loads(chart.proto.spec) for chart in app.get("plotly_chart")]
    return [
        spec
        for spec in specs
        if spec["layout"].get("xaxis", {}).get("title", {}).get("text") in (TIME_TITLE, WALL_TITLE)
    ]


def test_a_multi_day_runs_time_charts_read_on_the_wall_clock(three_days: Path) -> None:
    """Every time chart of every page: a date axis (UTC), its series from the run's first
    day to its last, hovers in wall time; none left in seconds."""
    with RunFile.open(three_days) as run:
        calendar = run_calendar(run)
    first_day, last_day = calendar.wall(0).date(), calendar.wall(calendar.grid.span_s).date()
    assert (last_day - first_day).days == 3  # 18:00 on a Friday to the Monday's evening, say
    app = start(three_days)
    for page, fewest in TIME_CHART_PAGES.items():
        charts = _time_charts(go_to(app, page))
        assert len(charts) >= fewest, page
        for spec in charts:
            xaxis, title = spec["layout"]["xaxis"], spec["layout"]["title"]["text"]
            assert xaxis["title"]["text"] == WALL_TITLE, (page, title)
            assert xaxis["type"] == "date" and xaxis["hoverformat"] == WALL_HOVER, (page, title)
            times = pd.to_datetime([x for trace in spec["data"] for x in trace["x"]])
            assert times.min().date() == first_day and times.max().date() == last_day, title
            assert calendar.wall(0) <= times.min() and times.max() <= calendar.wall(
                calendar.grid.span_s
            ), title
    # the free-block timeline's stretches under 10 % free say when each began, too
    (stretches,) = [frame.value for frame in app.dataframe if "start_s" in frame.value.columns]
    began = [calendar.wall(start_s) for start_s in stretches["start_s"]]
    assert stretches["from (UTC)"].tolist() == [f"{when:%a %d %b %H:%M:%S}" for when in began]


def test_a_multi_day_fleets_time_charts_read_on_the_wall_clock(tmp_path: Path) -> None:
    """Two engines' steps spread over two days: the Fleet page's free shares and duplicated
    blocks over time on the wall clock."""
    settings = CacheSettings(block_size=16, num_blocks=120)
    steps = [*sample_engine_steps(settings, 30, "a"), *sample_engine_steps(settings, 30, "b")]
    gap = int(2 * DAY_S * NS / len(steps))
    records = []
    for number, step in enumerate(steps):
        for record in step:
            record.ts_ns += (number % (len(steps) // 2)) * 2 * gap
        records.extend(step)
    path = tmp_path / "fleet.duckdb"
    store = RunStore.create(path, RunConfig("engine", 16, 120, "sha256", "test"))
    store.append(sorted(records, key=lambda record: record.ts_ns))
    store.finalize()
    store.close()
    with RunFile.open(path) as run:
        calendar = run_calendar(run)
    assert calendar.is_multi_day
    charts = {
        spec["layout"]["title"]["text"]: spec
        for spec in _time_charts(go_to(start(path), "views/fleet.py"))
    }
    assert {"Free share of each engine's pool", "Blocks cached on more than one engine"} <= set(
        charts
    )
    for spec in charts.values():
        assert spec["layout"]["xaxis"]["type"] == "date"
        times = pd.to_datetime([x for trace in spec["data"] for x in trace["x"]])
        assert calendar.wall(0) <= times.min() and times.max() <= calendar.wall(
            calendar.grid.span_s
        )
        assert (times.max() - times.min()).total_seconds() > DAY_S


def test_a_run_under_a_day_keeps_its_charts_in_seconds() -> None:
    app = start()
    charts = _time_charts(app)
    assert len(charts) >= 4
    for spec in charts:
        xaxis = spec["layout"]["xaxis"]
        assert xaxis["title"]["text"] == TIME_TITLE and "type" not in xaxis
        for trace in spec["data"]:  # seconds: numbers (Plotly sends arrays as typed bytes)
            x = trace["x"]
            seconds = np.frombuffer(base64.b64decode(x["bdata"]), x["dtype"]) if "bdata" in x else x
            assert len(seconds) and all(0 <= value < DAY_S for value in seconds)


def _spread_run(path: Path, days: float) -> Path:
    """An engine's first 40 sample requests, its steps spread evenly over `days`."""
    steps = list(sample_engine_steps(CacheSettings(block_size=16, num_blocks=120), 40, "e"))
    store = RunStore.create(path, RunConfig("engine", 16, 120, "sha256", "test"))
    for number, step in enumerate(steps):
        for record in step:
            record.ts_ns += number * int(days * DAY_S * NS / len(steps))
        store.append(step)
    store.finalize()
    store.close()
    return path


def test_the_last_24_h_moves_with_a_growing_run(tmp_path: Path) -> None:
    path = _spread_run(tmp_path / "run.duckdb", 2.5)
    app = start(path)
    app.selectbox(key="time_range_days").set_value(LAST_DAY).run()
    with RunFile.open(path) as run:
        before = run_calendar(run).ranges()[LAST_DAY]
    assert app.slider(key="time_range").value == before
    # The run grown by a day, as the next live copy of it is: the app shows it as the same
    # run (not picked: a pick starts over). DuckDB keeps a file open in this process, so
    # the grown run is another file rather than this one rewritten.
    grown = _spread_run(tmp_path / "grown.duckdb", 3.5)
    app.session_state["run_path"] = str(grown)
    app.run()
    assert not app.exception, app.exception
    with RunFile.open(grown) as run:
        after = run_calendar(run).ranges()[LAST_DAY]
    assert after[1] > before[1] + DAY_S / 2
    assert app.slider(key="time_range").value == after
    assert app.selectbox(key="time_range_days").value == LAST_DAY


def test_today_against_yesterday_equals_each_days_own_queries(three_days: Path) -> None:
    app = start(three_days)
    (table,) = [frame.value for frame in app.dataframe if "figure" in frame.value.columns]
    with RunFile.open(three_days) as run:
        calendar = run_calendar(run)
        pair = calendar.before(calendar.grid.whole_run())
        assert pair is not None
        today, yesterday = pair
        expected = comparison_table(compared_figures(run, today), compared_figures(run, yesterday))
        requests = [_requests_between(run, w.start_ns, w.end_ns) for w in (yesterday, today)]
        tokens = run.row(
            "SELECT sum(num_prompt_tokens) FILTER (WHERE ts_ns < $mid), "
            "sum(num_prompt_tokens) FILTER (WHERE ts_ns >= $mid) FROM events "
            "WHERE kind = 'lookup' AND NOT preempted AND ts_ns >= $start AND ts_ns < $end",
            {"start": yesterday.start_ns, "mid": today.start_ns, "end": today.end_ns},
        )
    assert yesterday.end_ns == today.start_ns and today.is_whole_run is False
    assert abs(today.duration_s - DAY_S) <= calendar.grid.bucket_s / 2
    assert today.duration_s == yesterday.duration_s
    assert min(requests) > 0
    pd.testing.assert_frame_equal(table.reset_index(drop=True), expected)
    shown = dict(zip(table["figure"], zip(table["before"], table["now"], strict=True), strict=True))
    assert tokens is not None
    assert shown["Prompt tokens"] == (f"{int(tokens[0]):,}", f"{int(tokens[1]):,}")
    (heading,) = [c.value for c in app.caption if " the same length before it" in c.value]
    assert calendar.span_words(today.start_s, today.end_s) in heading


def test_an_engine_restarted_with_another_pool_is_marked(tmp_path: Path) -> None:
    """Engine host:1 runs with 120 blocks; a day and a half later host:2 (the engine
    restarted: another pid) runs with 200."""
    first = CacheSettings(block_size=16, num_blocks=120)
    second = CacheSettings(block_size=16, num_blocks=200)
    path = tmp_path / "restart.duckdb"
    store = RunStore.create(path, RunConfig("engine", 16, 120, "sha256", "test"))
    later = int(1.5 * DAY_S * NS)
    steps: list[list[Event]] = [*sample_engine_steps(first, 30, "host:1")]
    for step in sample_engine_steps(second, 30, "host:2"):
        for record in step:
            record.ts_ns += later
        steps.append(step)
    for records in steps:
        store.append(records)
    store.finalize()
    store.close()
    with RunFile.open(path) as run:
        starts = engine_starts(run)
        calendar = run_calendar(run)
    assert starts["engine_id"].tolist() == ["host:1", "host:2"]
    assert starts["pool_blocks"].tolist() == [119, 199]  # the null block is not usable
    # written as a capture from before the collector kept each engine's settings: unknown,
    # so not compared (the run's row is the first engine's alone)
    assert starts["block_size"].isna().all() and starts["num_blocks"].isna().all()
    restart_s = float(starts["t_s"].iloc[1])
    assert abs(restart_s - 1.5 * DAY_S) < 60
    app = start(path)
    (line,) = [c.value.replace("\\", "") for c in app.caption if c.value.startswith("Engines")]
    when = f"{calendar.wall(restart_s):%a %d %b %H:%M} UTC"
    assert f"{when} ({restart_s:,.0f} s): host:2 started, 199 blocks (was 119)" in line
    assert "host:1 started" not in line  # it started the run: nothing changed there
    layouts = [json.loads(chart.proto.spec)["layout"] for chart in app.get("plotly_chart")]
    (hit_rate,) = [lay for lay in layouts if lay["title"]["text"].startswith("Prefix-cache hit")]
    # The run spans more than a day: the chart reads on the wall clock, the marker at the
    # restart's wall time, its label beside it.
    (marker,) = hit_rate["shapes"]
    (label,) = hit_rate["annotations"]
    assert hit_rate["xaxis"]["type"] == "date"
    at = pd.Timestamp(calendar.wall(restart_s))
    assert pd.Timestamp(marker["x0"]) == pd.Timestamp(marker["x1"]) == pd.Timestamp(label["x"])
    assert abs(pd.Timestamp(marker["x0"]) - at) < pd.Timedelta(milliseconds=1)
    assert label["text"] == "host:2 started, 199 blocks (was 119)"


def test_an_engine_that_joins_a_fleet_with_the_same_pool_is_no_marker(tmp_path: Path) -> None:
    """A fleet replay: the second engine's first record comes with its first request, after
    the run's first; it took over from no engine and has the same pool: nothing changed."""
    run_path = tiny_run(tmp_path, family_trace(), block_size=BLOCK_SIZE, num_blocks=20, engines=2)
    with RunFile.open(run_path) as run:
        starts = engine_starts(run)
        window = run_calendar(run).grid.whole_run()
    assert len(starts) == 2 and starts["t_s"].iloc[1] > 0
    assert engine_markers(starts, window).empty
    app = start(run_path)
    assert not [c for c in app.caption if c.value.startswith("Engines started")]


@pytest.mark.slow
def test_screenshots_of_the_overview_and_the_day_picker(three_days: Path, tmp_path: Path) -> None:
    """In a real Chromium: the Overview of the three-day run with today against yesterday,
    then the day picker's second calendar day picked (KVSCOPE_SCREENSHOTS keeps both)."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415 - selenium is a dev extra; only the browser tests load it

    with RunFile.open(three_days) as run:
        calendar = run_calendar(run)
    second_day = list(calendar.ranges())[4]
    with app_in_chromium(three_days) as (url, driver):
        whole = tmp_path / "overview_three_days.png"
        seen = screenshot_page(driver, url, whole, min_charts=6)
        assert seen["exceptions"] == [] and png_is_not_blank(whole), seen
        assert "Today against yesterday" in texts(driver, "h2, h3")
        keep_screenshot(whole)
        driver.set_window_size(1500, 1300)
        boxes = driver.find_elements(
            By.CSS_SELECTOR, '[data-testid="stSidebar"] [data-testid="stSelectbox"]'
        )
        (days,) = [box for box in boxes if "Days" in box.text]
        days.click()
        (option,) = [
            o
            for o in driver.find_elements(By.CSS_SELECTOR, '[role="option"]')
            if o.text == second_day
        ]
        option.click()
        start_s, end_s = calendar.ranges()[second_day]
        wanted = calendar.span_words(start_s, end_s)
        deadline = time.monotonic() + 60
        while wanted not in texts(
            driver, '[data-testid="stSidebar"] [data-testid="stCaptionContainer"]'
        ):
            assert time.monotonic() < deadline, "the picked day's range never showed"
            time.sleep(0.5)
        while driver.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]'):
            assert time.monotonic() < deadline, "the page never finished drawing the day"
            time.sleep(0.5)
        time.sleep(1.5)  # the charts' transitions
        picked = tmp_path / "overview_one_day.png"  # not screenshot_page: a reload forgets it
        driver.set_window_size(1500, 4800)
        time.sleep(0.5)
        driver.save_screenshot(str(picked))
        assert texts(driver, '[data-testid="stException"]') == [] and png_is_not_blank(picked)
        assert any(wanted in line for line in texts(driver, "[data-testid='stCaptionContainer']"))
        keep_screenshot(picked)
