"""Every page in a real headless Chromium, against a real app server, on the sample run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.browser import CHROMEDRIVER, CHROMIUM, app_server, chromium, screenshot_page
from tests.conftest import REPO, SAMPLE_RUN

# url path -> charts the page must draw
PAGES = {"": 2, "free_blocks": 1, "vllm_kv_events": 0, "advisor": 5}


def png_is_not_blank(path: Path) -> bool:
    from PIL import Image

    with Image.open(path) as image:
        colors = image.convert("RGB").getcolors(maxcolors=1_000_000)
    return colors is None or len(colors) > 50


@pytest.mark.slow
def test_screenshot_of_every_page(tmp_path: Path) -> None:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("Debian's chromium and chromium-driver are needed (see .ci/run)")
    keep = os.environ.get("KVSCOPE_SCREENSHOTS")
    with app_server(REPO, "--db", str(SAMPLE_RUN)) as url, chromium() as driver:
        for page, min_charts in PAGES.items():
            path = tmp_path / f"{page or 'overview'}.png"
            seen = screenshot_page(driver, f"{url}/{page}", path, min_charts)
            assert seen["exceptions"] == [], seen
            assert seen["charts"] >= min_charts, seen
            assert png_is_not_blank(path)
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                shutil.copy(path, Path(keep) / path.name)
