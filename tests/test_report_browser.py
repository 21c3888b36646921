"""The HTML report in a real headless Chromium with the network switched off."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.cli import main
from tests.support.browser import (
    chromium,
    keep_screenshot,
    need_chromium,
    png_is_not_blank,
    screenshot_page,
)
from tests.support.repo import SAMPLE_RUN, SAMPLE_TRACE

CHARTS = 4
# Each chart's traces, as plotly drew them: baseline and candidate in every chart.
DRAWN_TRACES = """
return [...document.querySelectorAll('.js-plotly-plot')].map(plot => ({
    title: plot.layout.title.text,
    traces: plot.data.length,
    drawn: plot.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length,
}));
"""
FETCHED = "return performance.getEntriesByType('resource').map(entry => entry.name);"


@pytest.fixture(scope="module")
def regression_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample run against the sample trace replayed into a third of its cache."""
    directory = tmp_path_factory.mktemp("report")
    candidate = directory / "small_cache.duckdb"
    replay = ["replay", str(SAMPLE_TRACE), "--out", str(candidate), "--block-size", "16"]
    replay += ["--num-blocks", "400", "--timing", "timestamps", "--max-num-seqs", "32"]
    assert main([*replay, "--reveal-tenants", "--quiet"]) == 0
    argv = ["report", "--baseline", str(SAMPLE_RUN), "--candidate", str(candidate)]
    assert main([*argv, "--out-dir", str(directory)]) == 1
    return directory / "report.html"


@pytest.mark.slow
def test_html_report_draws_its_charts_offline(regression_report: Path, tmp_path: Path) -> None:
    need_chromium()
    screenshot = tmp_path / "report.png"
    with chromium() as driver:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd(
            "Network.emulateNetworkConditions",
            {"offline": True, "latency": 0, "downloadThroughput": 0, "uploadThroughput": 0},
        )
        seen = screenshot_page(driver, regression_report.as_uri(), screenshot, CHARTS)
        charts = driver.execute_script(DRAWN_TRACES)
        fetched = driver.execute_script(FETCHED)
        text = driver.find_element("tag name", "body").text
    assert seen["title"] == "kvscope report: regression"
    assert seen["charts"] == CHARTS
    assert [chart["title"] for chart in charts] == [
        "Token hit ratio over time",
        "Free blocks over time (share of the pool)",
        "Blocks evicted so far",
        "Token hit ratio per tenant",
    ]
    for chart in charts:
        assert chart["traces"] == 2, chart
        assert chart["drawn"] == 2, chart
    assert [url for url in fetched if not url.startswith(("file:", "data:", "blob:"))] == []
    assert "Regression: token_hit_ratio, block_hit_ratio" in text
    assert png_is_not_blank(screenshot)
    keep_screenshot(screenshot)
