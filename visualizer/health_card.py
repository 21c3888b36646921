"""The Overview's first section: the run's health scorecard (collector/health/scorecard.py),
a line each, green, amber, red or grey, with one sentence of why and a link to the page
that shows it."""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from collector.advisor.replay_cache import cache_folder
from collector.health.line import HealthLine
from collector.health.scorecard import scorecard
from collector.health.thresholds import ENVIRONMENT, HealthThresholdsError, load_thresholds
from collector.safe_text import markdown_text
from collector.store.run_file import live_copy_path
from visualizer.pages import PAGES
from visualizer.run_source import open_run

# Each status as Streamlit's Markdown draws it: a coloured badge with a word.
BADGES = {
    "green": ":green-badge[healthy]",
    "amber": ":orange-badge[look]",
    "red": ":red-badge[act]",
    "grey": ":gray-badge[n/a]",
}
PAGE_FILES = {Path(page.file).stem: page for page in PAGES}


@st.cache_data(max_entries=16, show_spinner=False)
def _lines(
    path: str, versions: tuple[int, int], thresholds: str, advice_cache: str
) -> list[HealthLine]:
    """The scorecard of one version of a run under one thresholds file (cached: a page
    switch back to the Overview reads nothing again). `advice_cache`: the folder the
    advisor line may read kept advice from (collector/advisor/stored.py)."""
    del versions, advice_cache  # part of the cache key: a rewritten run is judged afresh
    return scorecard(
        open_run(Path(path)), load_thresholds(Path(thresholds) if thresholds else None)
    )


def forget_scorecards() -> None:
    """Judge every run afresh on its next view (the advice it was judged without is kept)."""
    _lines.clear()


def _modified(path: Path) -> int:
    return path.stat().st_mtime_ns if path.exists() else 0


def render(path: Path) -> None:
    """The scorecard of the run at `path`, over the whole run."""
    thresholds = os.environ.get(ENVIRONMENT, "")
    versions = (_modified(path), _modified(live_copy_path(path)))
    try:
        lines = _lines(str(path), versions, thresholds, str(cache_folder()))
    except HealthThresholdsError as error:
        st.error(f"Health scorecard not shown: {error}")
        return
    st.subheader("Health")
    for line in lines:
        words, link = st.columns([5, 1], vertical_alignment="center")
        words.markdown(
            f"{BADGES[line.status]} **{line.name}.** {markdown_text(line.sentence, None)}"
        )
        page = PAGE_FILES[line.page]
        link.page_link(page.path, label=page.title, icon=":material/arrow_forward:")
    source = f"`{markdown_text(thresholds)}`" if thresholds else "the defaults"
    st.caption(
        f"Over the whole run; thresholds from {source} (docs/health.md: each line's rule; "
        f"set {ENVIRONMENT} to a TOML file of your own to change them)."
    )
