"""A real app server and a real headless Chromium, for screenshots of every page."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port
from tests.support.repo import REPO

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1500,1300",
)


@contextmanager
def app_server(repo: Path, *arguments: str) -> Iterator[str]:
    """The app's server on 127.0.0.1, as `kvscope app` starts it (`visualizer/server.py`:
    `streamlit run visualizer/app.py`, the app's modules imported while the page loads);
    yields its base URL."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "visualizer.server",
        "run",
        str(repo / "visualizer" / "app.py"),
        "--server.headless",
        "true",
        "--server.address",
        "127.0.0.1",
        "--server.port",
        str(port),
        "--browser.gatherUsageStats",
        "false",
    ]
    if arguments:
        command += ["--", *arguments]
    process = subprocess.Popen(command, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError("the app server did not come up in 90 s")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def need_chromium() -> None:
    """Fails the test (it does not skip) where Debian's chromium or its driver is missing."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("Debian's chromium and chromium-driver are needed (see .ci/run)")


def keep_screenshot(path: Path) -> None:
    """A copy of the screenshot in the folder $KVSCOPE_SCREENSHOTS names, when it is set."""
    keep = os.environ.get("KVSCOPE_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)


@contextmanager
def chromium() -> Iterator[Any]:
    """A Selenium-driven headless Chromium from the system's packages (no downloads)."""
    from selenium import webdriver  # noqa: PLC0415 - selenium is a dev extra; only the browser tests load it
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415 - selenium is a dev extra; only the browser tests load it

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = Path(os.environ.get("TMPDIR", "/tmp")) / f"kvscope-chromium-{os.getpid()}"
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@contextmanager
def app_in_chromium(run: Path) -> Iterator[tuple[str, Any]]:
    """The app on `run` (its URL) and a headless Chromium to look at it with; the test fails
    where Debian's chromium is missing."""
    need_chromium()
    with app_server(REPO, "--db", str(run)) as url, chromium() as driver:
        yield url, driver


def texts(driver: Any, css: str) -> list[str]:
    """The text of every element that matches `css`, read in one script: Streamlit re-renders
    between a lookup and a read, and a held element reference can go stale in between."""
    found = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText)", css
    )
    return [str(text) for text in found]


def screenshot_page(
    driver: Any, url: str, path: Path, min_charts: int, timeout_s: float = 300
) -> dict[str, Any]:
    """Open a page, wait until its charts are drawn and Streamlit is idle, save a PNG.

    The wait is long: on a loaded CI machine the Advisor page (it replays the run for its
    what-ifs) once took over 60 s to draw, where it takes about 10 s on a quiet one."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415 - selenium is a dev extra; only the browser tests load it

    driver.get(url)
    started = time.monotonic()
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        charts = driver.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .main-svg")
        running = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]')
        if len(charts) >= min_charts and not running:
            break
        time.sleep(0.5)
    time.sleep(1.5)  # let the last chart finish its transition
    exceptions = texts(driver, '[data-testid="stException"]')
    # Streamlit scrolls its main section, not the body: measure the page's content.
    height = driver.execute_script(
        "const content = document.querySelector('[data-testid=\"stMainBlockContainer\"]');"
        "return content ? content.scrollHeight + 80 : document.body.scrollHeight"
    )
    driver.set_window_size(1500, max(1300, min(int(height) + 200, 8000)))
    time.sleep(0.5)
    driver.save_screenshot(str(path))
    return {
        "url": url,
        "waited_s": round(time.monotonic() - started, 1),
        "charts": len(driver.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")),
        "exceptions": exceptions,
        "title": driver.title,
    }


def png_is_not_blank(path: Path) -> bool:
    from PIL import Image  # noqa: PLC0415 - Pillow comes with selenium's tests only

    with Image.open(path) as image:
        colors = image.convert("RGB").getcolors(maxcolors=1_000_000)
    return colors is None or len(colors) > 50
