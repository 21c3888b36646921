"""Every page in a real headless Chromium, against a real app server, on the sample run; and
a click on the prefix tree picking that block."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.support.browser import (
    CHROMEDRIVER,
    CHROMIUM,
    app_server,
    chromium,
    png_is_not_blank,
    screenshot_page,
)
from tests.support.repo import REPO, SAMPLE_RUN
from visualizer.pages import PAGES

# page file -> charts the page must draw on the sample run
MIN_CHARTS = {
    "overview.py": 4,
    "hotspots.py": 4,
    "prefix_tree.py": 1,
    "roi.py": 3,
    "free_blocks.py": 1,
    "kv_groups.py": 0,  # the sample has one group; tests/test_kv_groups_page.py shows two
    "collisions.py": 1,
    "tenants.py": 3,
    "advisor.py": 5,
    "policies.py": 1,
    "compare.py": 2,
    "vllm_kv_events.py": 0,
}


def need_chromium() -> None:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("Debian's chromium and chromium-driver are needed (see .ci/run)")


@pytest.mark.slow
def test_screenshot_of_every_page(tmp_path: Path) -> None:
    need_chromium()
    keep = os.environ.get("KVSCOPE_SCREENSHOTS")
    with app_server(REPO, "--db", str(SAMPLE_RUN)) as url, chromium() as driver:
        for page in PAGES:
            path = tmp_path / f"{Path(page.file).stem}.png"
            min_charts = MIN_CHARTS[page.file]
            seen = screenshot_page(driver, f"{url}/{page.url_path}", path, min_charts)
            assert seen["exceptions"] == [], seen
            assert seen["charts"] >= min_charts, seen
            assert seen["title"] == "kvscope", seen
            assert png_is_not_blank(path)
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                shutil.copy(path, Path(keep) / path.name)


@pytest.mark.slow
def test_clicking_a_prefix_tree_node_picks_that_block(tmp_path: Path) -> None:
    need_chromium()
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    with app_server(REPO, "--db", str(SAMPLE_RUN)) as url, chromium() as driver:
        screenshot_page(driver, f"{url}/prefix_tree", tmp_path / "tree.png", 1)

        def block_shown() -> str:
            headers = driver.find_elements(By.CSS_SELECTOR, "h3")
            return next(h.text for h in headers if h.text.startswith("Block "))

        def any_block_shown() -> bool:
            headers = driver.find_elements(By.CSS_SELECTOR, "h3")
            return any(h.text.startswith("Block ") for h in headers)

        before = block_shown() if any_block_shown() else ""
        nodes = driver.find_elements(By.CSS_SELECTOR, ".js-plotly-plot g.slice")
        # The second-hottest family's system prompt, its label the start of its text.
        target = next(node for node in nodes if node.text.startswith("You are the customer"))
        snippet = target.text.split("…")[0]
        ActionChains(driver).move_to_element(target).click().perform()
        deadline = time.monotonic() + 30
        while (not any_block_shown() or block_shown() == before) and time.monotonic() < deadline:
            time.sleep(0.5)
        chosen = block_shown().removeprefix("Block ")
        # The select box and the block's details follow the click.
        picker = driver.find_element(
            By.CSS_SELECTOR,
            'input[aria-label="Block (or click one in the tree): the tree zooms to it"]',
        )
        picked = picker.get_attribute("value")
        assert snippet in picked and picked.endswith(chosen[:8])
        positions = picked.split(" · ")[0]
        assert positions.startswith("pos 0-")
        captions = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stCaptionContainer"]')
        assert any(text.text.startswith(f"{positions} of the prompt") for text in captions)
