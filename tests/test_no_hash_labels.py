"""Names, not hashes: on every page of the app, on each sample run, no chart label (axis
categories and tick labels, legend names, bar text) and no table cell in a label column is a
bare hex hash such as "9ae5f786" or "9ae5f786 (initech)". Hashes stay in hovers and in the
columns that hold them for download (named for the hash they hold)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from tests.support.app import go_to, start
from tests.support.repo import SAMPLE_RUN
from visualizer.pages import PAGES

HASH_LABEL = re.compile(r"^(0x)?[0-9a-f]{8,}( \(.*\))?$")
SAMPLE_RUNS = sorted(SAMPLE_RUN.parent.glob("*.duckdb"))
LABEL_FIELDS = ("x", "y", "labels", "text", "ticktext", "name")


def hash_columns(column: object) -> bool:
    """A column that holds hashes on purpose (for download or lookup): named for them."""
    name = str(column).lower()
    return "hash" in name or name in ("key", "fingerprint")


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def chart_labels(app: AppTest) -> Iterator[tuple[str, str]]:
    """Every label string of every plotly chart on the page, with where it was found."""
    for chart in app.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        title = spec.get("layout", {}).get("title", {}).get("text", "")
        for trace in spec.get("data", []):
            for field in LABEL_FIELDS:
                for text in strings(trace.get(field)):
                    yield f"{title}: trace {field}", text
        for name, axis in spec.get("layout", {}).items():
            if name.startswith(("xaxis", "yaxis")) and isinstance(axis, dict):
                for text in strings(axis.get("ticktext")):
                    yield f"{title}: {name} ticks", text


def table_labels(app: AppTest) -> Iterator[tuple[str, str]]:
    """Every string cell of every table on the page, but the columns named for hashes."""
    for table in (*app.get("arrow_data_frame"), *app.get("arrow_table")):
        frame = table.value if isinstance(table.value, pd.DataFrame) else pd.DataFrame()
        for column in frame.columns:
            if hash_columns(column) or frame[column].dtype != object:
                continue
            for cell in frame[column]:
                if isinstance(cell, str):
                    yield f"table column {column}", cell
        if isinstance(frame.index, pd.Index) and frame.index.dtype == object:
            for cell in frame.index:
                if isinstance(cell, str):
                    yield "table index", cell


def hash_labels(app: AppTest) -> list[str]:
    return [
        f"{where}: {text!r}"
        for where, text in (*chart_labels(app), *table_labels(app))
        if HASH_LABEL.match(text.strip())
    ]


@pytest.mark.parametrize("run", SAMPLE_RUNS, ids=[run.stem for run in SAMPLE_RUNS])
def test_no_page_labels_anything_by_a_bare_hash(run: Path) -> None:
    app = start(run, timeout_s=180)
    found = {}
    for page in PAGES:
        shown = hash_labels(go_to(app, page.path))
        if shown:
            found[page.title] = shown[:5]
    assert not found, found
