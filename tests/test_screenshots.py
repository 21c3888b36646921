"""Every page in a real headless Chromium, against a real app server, on the sample run; and
a click on the prefix tree picking that block."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.browser import (
    app_in_chromium,
    keep_screenshot,
    png_is_not_blank,
    screenshot_page,
    texts,
)
from tests.support.repo import SAMPLE_RUN
from visualizer.pages import PAGES

# page file -> charts the page must draw on the sample run
MIN_CHARTS = {
    "overview.py": 6,  # the waterfall and the families' losses lead
    "requests.py": 1,  # the first request's prompt, block by block
    "hotspots.py": 4,
    "prefix_tree.py": 1,
    "roi.py": 3,
    "free_blocks.py": 1,
    "kv_groups.py": 0,  # the sample has one group; tests/test_kv_groups_page.py shows two
    "collisions.py": 1,
    "tenants.py": 3,
    "fleet.py": 0,  # the sample has one engine; tests/test_fleet_page.py shows two
    "advisor.py": 5,
    "policies.py": 1,
    "compare.py": 2,
    "vllm_kv_events.py": 0,
}


@pytest.mark.slow
def test_screenshot_of_every_page(tmp_path: Path) -> None:
    with app_in_chromium(SAMPLE_RUN) as (url, driver):
        for page in PAGES:
            path = tmp_path / f"{Path(page.file).stem}.png"
            min_charts = MIN_CHARTS[page.file]
            seen = screenshot_page(driver, f"{url}/{page.url_path}", path, min_charts)
            assert seen["exceptions"] == [], seen
            assert seen["charts"] >= min_charts, seen
            assert seen["title"] == "kvscope", seen
            assert png_is_not_blank(path)
            keep_screenshot(path)


@pytest.mark.slow
def test_clicking_a_prefix_tree_node_picks_that_block(tmp_path: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains  # noqa: PLC0415 - selenium is a dev extra; only the browser tests load it
    from selenium.webdriver.common.by import By  # noqa: PLC0415 - selenium is a dev extra; only the browser tests load it

    with app_in_chromium(SAMPLE_RUN) as (url, driver):
        screenshot_page(driver, f"{url}/prefix_tree", tmp_path / "tree.png", 1)

        def block_shown() -> str:
            return next((h for h in texts(driver, "h3") if h.startswith("Block ")), "")

        before = block_shown()
        nodes = driver.find_elements(By.CSS_SELECTOR, ".js-plotly-plot g.slice")
        # The second-hottest family's system prompt, its label the start of its text.
        target = next(node for node in nodes if node.text.startswith("You are the customer"))
        snippet = target.text.split("…")[0]
        ActionChains(driver).move_to_element(target).click().perform()
        picker_css = 'input[aria-label="Block (or click one in the tree): the tree zooms to it"]'

        def settled() -> tuple[str, str, list[str]]:
            """The block shown, the select box's value and the captions, once the rerun that the
            click started has drawn all three (or at the deadline)."""
            deadline = time.monotonic() + 30
            while True:
                chosen = block_shown().removeprefix("Block ")
                picked = driver.execute_script(
                    "const box = document.querySelector(arguments[0]);return box ? box.value : ''",
                    picker_css,
                )
                captions = texts(driver, '[data-testid="stCaptionContainer"]')
                positions = picked.split(" · ")[0]
                done = (
                    chosen
                    and f"Block {chosen}" != before
                    and picked.endswith(chosen[:8])
                    and any(text.startswith(f"{positions} of the prompt") for text in captions)
                )
                if done or time.monotonic() > deadline:
                    return chosen, picked, captions
                time.sleep(0.5)

        chosen, picked, captions = settled()
        # The select box and the block's details follow the click.
        assert chosen and f"Block {chosen}" != before
        assert snippet in picked and picked.endswith(chosen[:8])
        positions = picked.split(" · ")[0]
        assert positions.startswith("pos 0-")
        assert any(text.startswith(f"{positions} of the prompt") for text in captions)
