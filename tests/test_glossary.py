"""One glossary: docs/glossary.md defines every term of visualizer/glossary.py in the same
words, and every metric on every page of the app, on each sample run, has a tooltip."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.app import go_to, start
from tests.support.repo import REPO, SAMPLE_RUN
from visualizer.glossary import METRICS, TERMS
from visualizer.pages import PAGES

SAMPLE_RUNS = sorted(SAMPLE_RUN.parent.glob("*.duckdb"))


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_docs_glossary_says_what_the_tooltips_say() -> None:
    page = flat((REPO / "docs" / "glossary.md").read_text(encoding="utf-8"))
    for term, definition in TERMS.items():
        assert f"**{term}**: {flat(definition)}" in page, term
    defined = re.findall(r"\*\*([^*]+)\*\*:", page)
    assert defined == list(TERMS)  # and nothing the app does not say
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "(docs/glossary.md)" in readme
    assert all(text.strip() for text in METRICS.values())


@pytest.mark.parametrize("run", SAMPLE_RUNS, ids=[run.stem for run in SAMPLE_RUNS])
def test_every_metric_on_every_page_has_a_tooltip(run: Path) -> None:
    app = start(run, timeout_s=180)
    bare = {}
    for page in PAGES:
        shown = go_to(app, page.path)
        missing = [metric.label for metric in shown.metric if not metric.proto.help.strip()]
        if missing:
            bare[page.title] = missing
    assert not bare, bare
