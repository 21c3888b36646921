"""How long each app page takes to be drawn after its click in the navigation, in a real
headless Chromium, on each sample run: its first view after the app started (cold) and a
later view (warm), against the goals of 2 s cold and 1 s warm. Prints one Markdown table.

    .venv/bin/python benchmarks/page_timing.py [--runs sample_data/run.duckdb ...]
        [--pages overview,advisor] [--timeout-s 300] [--keep-replays] [--advised]

For each run it starts the app server (`streamlit run visualizer/app.py -- --db RUN`, on a
free 127.0.0.1 port, as tests/support/browser.py starts it) and one headless Chromium
(Debian's chromium and chromium-driver through Selenium), opens the app on its default page
(the Overview), then clicks every page of `visualizer/pages.py` in the navigation in order
(the cold round), then every page again in the same order (the warm round). The Overview's
cold figure is the app's opening (from the browser's `get` of the URL, page load included),
not a click: that is its first view. A page that is not in this run's navigation is skipped
with a note.

A page is *drawn* when, polled every 50 ms from the click:

- the browser's path is the page's (`Page.url_path`);
- the main area shows a title (`h1`) other than the one before the click (every page's
  title differs), so the new page's script has sent its content;
- Streamlit's script state (`data-test-script-state` on `stApp`) is `notRunning` and its
  running indicator (`stStatusWidget`) is gone: the page's script ended;
- no element of the main area is marked stale (`data-stale="true"`): nothing of the page
  before is still shown;
- every Plotly chart of the main area has drawn its SVG (`.main-svg`).

The time is the wall clock from just before Selenium's click to the first poll that finds
all five (so within about 50 ms, plus one poll's own time, above the truth). The replays the
Advisor keeps (`$KVSCOPE_CACHE_DIR`) start empty, in a folder of the benchmark's own, unless
--keep-replays: a cold view is then the first view of a run ever advised on this machine.
With --advised, each run is copied into the benchmark's folder and `kvscope advise COPY` run
on it first (its own cache folder): the app then reads the advice kept in the run file, as
after an operator advised a finished capture once, or as `kvscope replay` leaves the runs it
writes (it advises at its end: collector/advisor/stored.py). --pages names two pages at
least: a later view is timed from a click on the page while another is shown.
Wall-clock figures of a shared machine move; run it on a quiet one for figures to compare.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.browser import CHROMEDRIVER, CHROMIUM, app_server, chromium
from tests.support.repo import REPO
from visualizer.pages import PAGES, Page

GOALS_S = {"cold": 2.0, "warm": 1.0}
POLL_S = 0.05
STATE = """
const app = document.querySelector('[data-testid="stApp"]');
const main = document.querySelector('[data-testid="stMain"]');
if (!app || !main) return null;
const title = main.querySelector('h1');
const charts = Array.from(main.querySelectorAll('[data-testid="stPlotlyChart"]'));
return {
  path: location.pathname,
  title: title ? title.innerText.trim() : '',
  state: app.getAttribute('data-test-script-state'),
  running: document.querySelectorAll('[data-testid="stStatusWidget"]').length,
  stale: main.querySelectorAll('[data-stale="true"]').length,
  charts: charts.length,
  drawn: charts.filter(chart => chart.querySelector('.main-svg')).length,
  exceptions: main.querySelectorAll('[data-testid="stException"]').length,
};
"""
# The navigation's link to a page, found by its path; Streamlit folds long navigations
# behind a "View more" button, which is pressed first where it is shown.
LINK = """
const more = Array.from(document.querySelectorAll('[data-testid="stSidebarNavViewButton"]'))
  .find(button => button.innerText.toLowerCase().includes('more'));
if (more) more.click();
return Array.from(document.querySelectorAll('a[data-testid="stSidebarNavLink"]'))
  .find(link => new URL(link.href).pathname === arguments[0]) || null;
"""


@dataclass
class Seen:
    """One view of one page: seconds to drawn (None when not drawn), and what was noted."""

    seconds: float | None
    note: str = ""


def path_of(page: Page) -> str:
    return f"/{page.url_path}"


def wait_drawn(
    driver: Any, page: Page, title_before: str, started: float, timeout_s: float
) -> Seen:
    """Polls until `page` is drawn (the module's docstring says when); the seconds since
    `started`."""
    deadline = started + timeout_s
    state: dict[str, Any] | None = None
    while time.perf_counter() < deadline:
        state = driver.execute_script(STATE)
        if state and drawn(state, page, title_before):
            seconds = time.perf_counter() - started
            note = f"{state['exceptions']} exception(s) shown" if state["exceptions"] else ""
            return Seen(seconds, note)
        time.sleep(POLL_S)
    return Seen(None, f"not drawn in {timeout_s:.0f} s (last seen: {state})")


def drawn(state: dict[str, Any], page: Page, title_before: str) -> bool:
    return bool(
        state["path"] == path_of(page)
        and state["title"]
        and state["title"] != title_before
        and state["state"] == "notRunning"
        and not state["running"]
        and not state["stale"]
        and state["drawn"] == state["charts"]
    )


def click(driver: Any, page: Page, timeout_s: float) -> Seen:
    """Clicks `page` in the navigation and times it until drawn."""
    link = driver.execute_script(LINK, path_of(page))
    if link is None:
        return Seen(None, "not in this run's navigation: skipped")
    before = driver.execute_script(STATE)
    started = time.perf_counter()
    link.click()
    return wait_drawn(driver, page, before["title"] if before else "", started, timeout_s)


def time_run(run: Path, pages: list[Page], timeout_s: float) -> dict[str, dict[str, Seen]]:
    """Page file -> {"cold": ..., "warm": ...} for one run, in a fresh app server."""
    seen: dict[str, dict[str, Seen]] = {page.file: {} for page in pages}
    default = next(page for page in PAGES if page.default)
    with app_server(REPO, "--db", str(run)) as url, chromium() as driver:
        started = time.perf_counter()
        driver.get(f"{url}/")
        opened = wait_drawn(driver, default, "", started, timeout_s)
        if default.file in seen:
            opened.note = "; ".join(filter(None, ["cold: the app's opening", opened.note]))
            seen[default.file]["cold"] = opened
        for kind in ("cold", "warm"):
            for page in pages:
                if kind == "cold" and page.default:
                    continue
                seen[page.file][kind] = click(driver, page, timeout_s)
    return seen


def verdict(cold: Seen, warm: Seen) -> str:
    if cold.seconds is None and warm.seconds is None and "skipped" in cold.note:
        return "skipped"
    met = (
        cold.seconds is not None
        and warm.seconds is not None
        and cold.seconds <= GOALS_S["cold"]
        and warm.seconds <= GOALS_S["warm"]
    )
    return "PASS" if met else "MISS"


def table(results: dict[str, dict[str, dict[str, Seen]]], pages: list[Page]) -> list[str]:
    goal = f"{GOALS_S['cold']:.0f} s / {GOALS_S['warm']:.0f} s"
    lines = [
        "| run | page | cold s | warm s | goal (cold / warm) | verdict | note |",
        "| --- | --- | ---: | ---: | --- | --- | --- |",
    ]
    for run, seen in results.items():
        for page in pages:
            cold, warm = seen[page.file]["cold"], seen[page.file]["warm"]
            figures = [f"{s.seconds:.2f}" if s.seconds is not None else "-" for s in (cold, warm)]
            notes = "; ".join(dict.fromkeys(filter(None, [cold.note, warm.note])))
            lines.append(
                f"| {run} | {page.title} | {figures[0]} | {figures[1]} | {goal} "
                f"| {verdict(cold, warm)} | {notes} |"
            )
    return lines


def advised(run: Path, folder: Path) -> Path:
    """A copy of `run` in `folder` that `kvscope advise` kept its advice in."""
    copy = folder / "advised" / run.name
    copy.parent.mkdir(exist_ok=True)
    shutil.copyfile(run, copy)
    env = {**os.environ, "KVSCOPE_CACHE_DIR": str(folder / "advise-cache")}
    command = [sys.executable, "-m", "collector.cli", "advise", str(copy), "--quiet"]
    subprocess.run(command, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=Path, nargs="+", default=sorted((REPO / "sample_data").glob("*.duckdb"))
    )
    parser.add_argument("--pages", help="page files' stems, comma-separated (default: all)")
    parser.add_argument("--timeout-s", type=float, default=300, help="per view")
    parser.add_argument("--keep-replays", action="store_true", help="use the kept replays")
    parser.add_argument(
        "--advised",
        action="store_true",
        help="time copies `kvscope advise` ran on first (as `kvscope replay` leaves a run)",
    )
    args = parser.parse_args()
    pages = list(PAGES)
    if args.pages:
        wanted = set(args.pages.split(","))
        pages = [page for page in PAGES if Path(page.file).stem in wanted]
        if len(pages) != len(wanted):
            raise SystemExit(f"--pages: no such page among {[Path(p.file).stem for p in PAGES]}")
        if len(pages) < 2:  # a page's view is drawn when its title replaces another's
            raise SystemExit(
                "--pages: name two pages at least (a later view of a page is timed "
                "from a click on it while another page is shown)"
            )
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        print("page_timing: Debian's chromium and chromium-driver are needed", file=sys.stderr)
        raise SystemExit(2)
    for run in args.runs:
        if not run.is_file():
            print(f"page_timing: {run}: no such run file", file=sys.stderr)
            raise SystemExit(2)
    results = {}
    with tempfile.TemporaryDirectory(prefix="kvscope-page-timing-") as folder:
        runs = [advised(run, Path(folder)) for run in args.runs] if args.advised else args.runs
        for run in runs:
            if not args.keep_replays:
                os.environ["KVSCOPE_CACHE_DIR"] = str(Path(folder) / run.stem)
            print(f"timing {run.name} ...", file=sys.stderr, flush=True)
            results[run.name] = time_run(run, pages, args.timeout_s)
    print("\n".join(table(results, pages)))


if __name__ == "__main__":
    main()
