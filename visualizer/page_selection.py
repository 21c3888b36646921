"""Which pages the navigation offers for the run shown: a page that needs an optional feature
of a run (several KV cache groups, several engines, vLLM's KV events, the collision check;
collector/queries/features.py) is left out of it when the run lacks that feature, and the
Overview says in one line which pages were left out and why. A page left out still opens
from its address (or `st.switch_page`) and says there why it has nothing to show."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import streamlit as st

from collector.queries.features import RunFeatures, run_features
from collector.store.run_file import ReadError, StoreError
from visualizer.pages import PAGES, VIEWS, Page
from visualizer.run_source import current_run, not_written_yet, open_run, run_versions


def _engines_missing(features: RunFeatures) -> str:
    engines = features["engines"]
    return "" if engines > 1 else ("one engine" if engines == 1 else "no engine's requests")


# a page's `needs` -> why a run without it has nothing for the page ("" when it has it)
MISSING: dict[str, Callable[[RunFeatures], str]] = {
    "hybrid": lambda features: "" if features["hybrid"] else "one KV cache group",
    "engines": _engines_missing,
    "vllm_kv_events": lambda features: "" if features["vllm_kv_events"] else "no vLLM KV events",
    "collisions_checked": lambda features: (
        "" if features["collisions_checked"] else "collision check off"
    ),
}


def left_out(features: RunFeatures | None) -> list[tuple[Page, str]]:
    """The pages this run has nothing for, each with why; none for a run whose features could
    not be read (a damaged or not yet written run shows every page)."""
    if features is None:
        return []
    reasons = ((page, MISSING[page.needs](features)) for page in PAGES if page.needs)
    return [(page, reason) for page, reason in reasons if reason]


def note(features: RunFeatures | None) -> str:
    """One line naming the pages left out and why, or "" when every page applies."""
    missing = left_out(features)
    if not missing:
        return ""
    titles = ", ".join(page.title for page, _ in missing)
    reasons = ", ".join(reason for _, reason in missing)
    return f"{titles}: not in this run ({reasons}), so left out of the navigation."


def current_features() -> RunFeatures | None:
    """The shown run's optional features, or None when it cannot be read (yet)."""
    path = current_run()
    if not_written_yet(path):
        return None
    try:
        return _features(str(path), run_versions(path))
    except (ReadError, StoreError, OSError):
        return None


@st.cache_data(max_entries=16, show_spinner=False)
def _features(path: str, versions: tuple[int, int]) -> RunFeatures:
    del versions  # part of the cache key: a rewritten run (or live copy) is read afresh
    return run_features(open_run(Path(path)))


def navigation() -> list[st.Page]:
    """Every page for `st.navigation`, those the shown run has nothing for hidden from its
    menu (still served at their address)."""
    return navigation_for(current_features())


def navigation_for(features: RunFeatures | None) -> list[st.Page]:
    """Every page, those a run of these features has nothing for hidden from the menu."""
    hidden = {page.file for page, _ in left_out(features)}
    return [
        st.Page(
            VIEWS / page.file,
            title=page.title,
            default=page.default,
            visibility="hidden" if page.file in hidden else "visible",
        )
        for page in PAGES
    ]
