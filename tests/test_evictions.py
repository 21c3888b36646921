"""What evicts what (collector/queries/evictions.py, the Free blocks page's matrix) on the
EVICTIONS run, whose evictions are known by hand (tests/support/runs.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from collector.queries import evictions
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile
from tests.support.app import go_to, start
from tests.support.runs import evictions_run, family_roots
from visualizer.charts.evictions import eviction_matrix_figure, top_cells


@pytest.fixture
def run_path(tmp_path: Path) -> Path:
    return evictions_run(tmp_path)


def test_evictions_by_family_and_by_tenant(run_path: Path) -> None:
    with RunFile.open(run_path) as run_file:
        roots = family_roots(run_file)
        window = time_grid(run_file).whole_run()
        by_family = evictions.eviction_matrix(run_file, window, "family")
        by_tenant = evictions.eviction_matrix(run_file, window, "tenant")
        regretted = evictions.regretted_families(run_file, window)
        late = evictions.eviction_matrix(run_file, time_grid(run_file).buckets(550, 600), "tenant")
    # z0 (family Z, tenant y) took X1, X2 and Y3; x1 (family X, tenant x) took Y1 and Y2.
    assert cells(by_family) == {
        (roots["Z"], roots["X"], 2, "y", "x"),
        (roots["X"], roots["Y"], 2, "x", "y"),
        (roots["Z"], roots["Y"], 1, "y", "y"),
    }
    assert cells(by_tenant) == {("x", "y", 2, None, None), ("y", "x", 2, None, None),
                                ("y", "y", 1, None, None)}  # fmt: skip
    assert by_family["evictions"].tolist() == by_tenant["evictions"].tolist() == [2, 2, 1]
    # X was needed again 10 ms after z0 evicted it; Y never was.
    assert regretted.to_dict("records") == [
        {"family": roots["X"], "owner": "x", "evictions": 2, "needed_again": 2,
         "regret_share": 1.0, "median_needed_again_s": pytest.approx(0.010)},
    ]  # fmt: skip
    # Buckets 550-600 hold x1 (30 ms) alone: its two evictions.
    assert cells(late) == {("x", "y", 2, None, None)}
    with pytest.raises(ValueError, match="no such axis"):
        evictions.eviction_matrix(run_file, window, "block")  # type: ignore[arg-type]


def test_the_matrix_folds_the_rest_and_leaves_empty_pairs_blank() -> None:
    cells = pd.DataFrame(
        {
            "evicting": ["a", "a", "b", "c", "d"],
            "evicted": ["p", "q", "p", "r", "p"],
            "evictions": [5, 1, 4, 2, 1],
        }
    )
    folded = top_cells(cells, limit=2)
    # Rows a (6) and b (4) stay, c and d fold; columns p (10) and r (2) stay, q folds.
    assert sorted(map(tuple, folded.to_numpy().tolist())) == [
        ("(others)", "p", 1),
        ("(others)", "r", 2),
        ("a", "(others)", 1),
        ("a", "p", 5),
        ("b", "p", 4),
    ]
    (heat,) = eviction_matrix_figure(folded, "t").data
    assert list(heat.y) == ["a", "b", "(others)"] and list(heat.x) == ["p", "r", "(others)"]
    assert [list(row) for row in heat.text] == [["5", "", "1"], ["4", "", ""], ["1", "2", ""]]


def test_the_free_blocks_page_shows_what_evicts_what(run_path: Path) -> None:
    # No token ids recorded: each family is named by its first storer's tenant and request.
    x, y, z = "x · request x0", "y · request y0", "y · request z0"
    app = go_to(start(run_path), "views/free_blocks.py")
    assert not app.exception, app.exception
    assert app.radio(key="free_blocks_eviction_axis").value == "family"
    assert len(app.get("plotly_chart")) == 2  # the timeline, then the matrix
    heat = matrix(app)
    assert heat["y"] == [z, x]
    assert heat["x"] == [y, x]
    assert heat["text"] == [["1", "2"], ["2", ""]]
    (table,) = [frame for frame in app.dataframe if "prefix family" in frame.value]
    assert table.value.to_dict("records") == [
        {"prefix family": x, "blocks evicted": 2, "needed again": 2,
         "share needed again": "100%", "median time until needed (s)": 0.01},
    ]  # fmt: skip
    app.radio(key="free_blocks_eviction_axis").set_value("tenant").run()
    heat = matrix(app)
    assert heat["y"] == ["y", "x"] and heat["x"] == ["y", "x"]
    assert heat["text"] == [["1", "2"], ["2", ""]]


def cells(matrix: pd.DataFrame) -> set[tuple[Any, ...]]:
    """The matrix's rows as tuples, NULLs as None."""
    return {
        tuple(None if pd.isna(value) else value for value in row)
        for row in matrix.itertuples(index=False)
    }


def matrix(app: AppTest) -> dict[str, Any]:
    """The eviction matrix's rows, columns and cell texts."""
    (trace,) = json.loads(app.get("plotly_chart")[1].proto.spec)["data"]
    return {"x": trace["x"], "y": trace["y"], "text": trace["text"]}
