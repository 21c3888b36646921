"""Hotspot queries on a small real run (tests/support/runs.py), with exact rows."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from collector.queries import hotspots
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile
from tests.support.app import go_to, start
from tests.support.repo import SAMPLE_RUN
from tests.support.runs import evictions_run, family_roots, hex_names, shared_prefix_run
from visualizer.charts import hotspots as hotspot_charts


@pytest.fixture
def run_file(tmp_path: Path) -> RunFile:
    return RunFile.open(shared_prefix_run(tmp_path))


def test_block_heatmap(run_file: RunFile) -> None:
    heat = hotspots.block_heatmap(run_file, time_grid(run_file).whole_run())
    assert heat.to_dict("records") == [
        {"t_s": 0.0, "block_start": 1, "hits": 0, "stores": 1, "evictions": 0},
        {"t_s": 0.0, "block_start": 2, "hits": 0, "stores": 1, "evictions": 0},
        {"t_s": 0.01, "block_start": 1, "hits": 1, "stores": 0, "evictions": 0},
        {"t_s": 0.01, "block_start": 2, "hits": 1, "stores": 0, "evictions": 0},
        {"t_s": 0.01, "block_start": 3, "hits": 0, "stores": 1, "evictions": 0},
        {"t_s": 0.02, "block_start": 1, "hits": 1, "stores": 0, "evictions": 0},
        {"t_s": 0.02, "block_start": 4, "hits": 0, "stores": 1, "evictions": 0},
        {"t_s": 0.03, "block_start": 3, "hits": 0, "stores": 1, "evictions": 1},
        {"t_s": 0.03, "block_start": 5, "hits": 0, "stores": 1, "evictions": 0},
    ]
    later = hotspots.block_heatmap(run_file, time_grid(run_file).buckets(500, 600))
    assert later[["t_s", "block_start", "evictions"]].to_dict("records") == [
        {"t_s": 0.03, "block_start": 3, "evictions": 1},
        {"t_s": 0.03, "block_start": 5, "evictions": 0},
    ]


def test_top_blocks(run_file: RunFile) -> None:
    names = hex_names(run_file)
    top = hotspots.top_blocks(run_file, time_grid(run_file).whole_run())
    family = str(int(names["A1"], 16))  # the first block's hash, in decimal
    assert top.to_dict("records") == [
        {"block_hash": names["A1"], "block_position": 0, "hits": 2, "stores": 1, "evictions": 0,
         "first_use_s": 0.0, "last_use_s": 0.02, "tenant": "a", "lora": None,
         "family": family},
        {"block_hash": names["A2"], "block_position": 1, "hits": 1, "stores": 1, "evictions": 0,
         "first_use_s": 0.0, "last_use_s": 0.01, "tenant": "a", "lora": None,
         "family": family},
    ]  # fmt: skip
    # Inside a window the figures are the window's: a1 hit A1 at 20 ms, nothing stored it.
    late = hotspots.top_blocks(run_file, time_grid(run_file).buckets(300, 600))
    assert late.to_dict("records") == [
        {"block_hash": names["A1"], "block_position": 0, "hits": 1, "stores": 0, "evictions": 0,
         "first_use_s": 0.02, "last_use_s": 0.02, "tenant": "a", "lora": None,
         "family": family},
    ]  # fmt: skip


@pytest.mark.parametrize("measure", hotspots.HEAT_MEASURES)
def test_top_blocks_from_events_equal_the_rollup_over_the_whole_run(
    run_file: RunFile, measure: str
) -> None:
    window = time_grid(run_file).whole_run()
    from_rollup = hotspots.top_blocks(run_file, window, measure=measure)
    from_events = hotspots._top_blocks(
        run_file, hotspots._top_from_events(measure), window, 20, events=True
    )
    pd.testing.assert_frame_equal(from_rollup, from_events, check_dtype=False)


def test_most_stored_and_most_evicted_blocks(run_file: RunFile) -> None:
    names = hex_names(run_file)
    window = time_grid(run_file).whole_run()
    # c0 evicted B3; every block was stored once: by position, then hash.
    evicted = hotspots.top_blocks(run_file, window, measure="evictions")
    assert evicted[["block_hash", "evictions", "hits"]].to_dict("records") == [
        {"block_hash": names["B3"], "evictions": 1, "hits": 0}
    ]
    stored = hotspots.top_blocks(run_file, window, measure="stores")
    assert stored["stores"].tolist() == [1] * 6
    assert stored["block_position"].tolist() == sorted(stored["block_position"])
    with pytest.raises(ValueError, match="no such measure"):
        hotspots.top_blocks(run_file, window, measure="reads")


def test_hit_count_frequencies(run_file: RunFile) -> None:
    grid = time_grid(run_file)
    # Six blocks were cached: A1 was hit twice while cached, A2 once; B3, C2, S1, S2 never.
    whole = hotspots.hit_count_frequencies(run_file, grid.whole_run())
    assert whole.to_dict("records") == [
        {"hits": 0, "blocks": 4},
        {"hits": 1, "blocks": 1},
        {"hits": 2, "blocks": 1},
    ]
    # Cached in a0's bucket: A1 and A2, with all their hits (also those after the bucket).
    assert hotspots.hit_count_frequencies(run_file, grid.buckets(0, 0)).to_dict("records") == [
        {"hits": 1, "blocks": 1},
        {"hits": 2, "blocks": 1},
    ]
    # Cached in b0's bucket: B3, never hit before c0 evicted it.
    assert hotspots.hit_count_frequencies(run_file, grid.buckets(200, 200)).to_dict("records") == [
        {"hits": 0, "blocks": 1}
    ]


def test_histogram_and_skew() -> None:
    frequencies = pd.DataFrame({"hits": [0, 1, 2, 3, 4, 9], "blocks": [90, 4, 2, 1, 2, 1]})
    histogram = hotspots.hit_count_histogram(frequencies)
    assert histogram.to_dict("records") == [
        {"bin": "0", "low": 0, "high": 0, "blocks": 90, "hits": 0},
        {"bin": "1", "low": 1, "high": 1, "blocks": 4, "hits": 4},
        {"bin": "2", "low": 2, "high": 2, "blocks": 2, "hits": 4},
        {"bin": "3-4", "low": 3, "high": 4, "blocks": 3, "hits": 11},
        {"bin": "9-16", "low": 9, "high": 16, "blocks": 1, "hits": 9},
    ]
    # 100 hashes, 28 hits: the top 1 % (one hash) took 9, the top 10 % all 28.
    assert hotspots.reuse_skew(frequencies) == {
        "blocks": 100,
        "hits": 28,
        "top_1pct_hit_share": 9 / 28,
        "top_10pct_hit_share": 1.0,
        "never_hit_share": 0.9,
    }


def owner_totals(heat: pd.DataFrame) -> dict[Any, tuple[int, int, int, int]]:
    """Per row (its key; None for the folded rest): rank, hits, stores and evictions."""
    totals = {}
    for key, rows in heat.groupby("row_key", dropna=False):
        sums = rows[["hits", "stores", "evictions"]].sum()
        totals[None if pd.isna(key) else key] = (
            int(rows["rank"].iloc[0]),
            *(int(value) for value in sums),
        )
    return totals


def test_heatmap_rows_by_prefix_family_and_by_tenant(tmp_path: Path) -> None:
    # EVICTIONS (tests/support/runs.py): x0 stores X1-X2 (tenant x), y0 Y1-Y3 (tenant y), z0
    # Z1-Z3 (tenant y) evicting X1, X2 and Y3, then x1 stores X1-X2 again evicting Y1-Y2.
    with RunFile.open(evictions_run(tmp_path)) as run_file:
        roots = family_roots(run_file)
        window = time_grid(run_file).whole_run()
        by_family = hotspots.owner_heatmap(run_file, window, "family")
        by_tenant = hotspots.owner_heatmap(run_file, window, "tenant")
        folded = hotspots.owner_heatmap(run_file, window, "tenant", max_rows=1)
    families = owner_totals(by_family)
    assert {key: value[1:] for key, value in families.items()} == {
        str(roots["X"]): (0, 4, 2),
        str(roots["Y"]): (0, 3, 3),
        str(roots["Z"]): (0, 3, 0),
    }
    assert families[str(roots["Z"])][0] == 3  # the least active family last
    owners = dict(zip(by_family["row_key"], by_family["owner"], strict=True))
    assert owners == {str(roots["X"]): "x", str(roots["Y"]): "y", str(roots["Z"]): "y"}
    assert owner_totals(by_tenant) == {"y": (1, 0, 6, 3), "x": (2, 0, 4, 2)}
    assert owner_totals(folded) == {"y": (1, 0, 6, 3), None: (2, 0, 4, 2)}


def test_the_hotspots_page_rows_by_family_or_tenant(tmp_path: Path) -> None:
    run = evictions_run(tmp_path)
    # No token ids recorded: each family is named by its first storer's tenant and request.
    x, y, z = "x · request x0", "y · request y0", "y · request z0"
    app = go_to(start(run), "views/hotspots.py")
    assert app.radio(key="hotspots_rows").value == "family"
    app.radio(key="hotspots_measure").set_value("stores").run()
    assert not app.exception, app.exception
    rows, stores = heatmap_rows(app)
    # The most active family on top: X and Y (6 each), then Z (3).
    assert rows[0] == z and set(rows[1:]) == {x, y}
    assert dict(zip(rows, stores, strict=True)) == {x: 4, y: 3, z: 3}
    app.radio(key="hotspots_rows").set_value("tenant").run()
    assert heatmap_rows(app) == (["x", "y"], [4, 6])


def heatmap_rows(app: AppTest) -> tuple[list[str], list[int]]:
    """The Hotspots heatmap's rows (bottom first) and each row's total."""
    (heat,) = json.loads(app.get("plotly_chart")[0].proto.spec)["data"]
    z = heat["z"]  # a typed array: dtype, base64 data and shape
    shape = [int(size) for size in str(z["shape"]).split(",")]
    grid = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(shape)
    return list(heat["y"]), [int(np.nansum(row)) for row in grid]


def test_the_heatmaps_name_a_cells_width_in_time() -> None:
    heat = pd.DataFrame(
        {
            "t_s": [0.0, 1.2, 3.6, 0.0],
            "block_start": [0, 0, 0, 16],
            "hits": [1, 2, 4, 3],
            "stores": [0, 0, 0, 0],
            "evictions": [0, 0, 0, 0],
        }
    )
    (blocks,) = hotspot_charts.heatmap_figure(heat, "hits", 16).data
    assert blocks.colorbar.title.text == "hits per 1.2 s"  # a gap (2.4 s) is two cells
    owned = heat.assign(row=["a", "a", "a", "b"], rank=[1, 1, 1, 2])
    (rows,) = hotspot_charts.owner_heatmap_figure(owned, "hits", "tenant").data
    assert rows.colorbar.title.text == "hits per 1.2 s"
    assert list(rows.y) == ["b", "a"]  # the first-ranked row on top


def test_block_runs_fold_a_shared_prefixs_blocks_into_one_bar() -> None:
    # On the sample the twenty most-hit blocks are one family's first blocks, 147 hits each:
    # one run of blocks alike, not twenty identical bars.
    with RunFile.open(SAMPLE_RUN) as run_file:
        top = hotspots.top_blocks(run_file, time_grid(run_file).whole_run(), 400)
    runs = hotspots.block_runs(top, "hits", 20)
    first = runs.iloc[0]
    assert first["hits"] == top["hits"].max() == 147
    assert first["blocks"] == (top["hits"] == 147).sum() >= 20
    assert (first["first_position"], first["first_hash"]) == (0, top["block_hash"].iloc[0])
    assert runs["hits"].is_monotonic_decreasing and len(runs) == 20
    # every block of a run shares its family and counts
    for run in runs.head(5).to_dict("records"):
        alike = top[(top["family"] == run["family"]) & (top["hits"] == run["hits"])]
        alike = alike[(alike["stores"] == run["stores"]) & (alike["evictions"] == run["evictions"])]
        assert len(alike) == run["blocks"]


def test_the_hotspots_page_draws_a_bar_per_run_of_blocks_alike() -> None:
    app = go_to(start(), "views/hotspots.py")
    (bars,) = [
        json.loads(chart.proto.spec)["data"][0]
        for chart in app.get("plotly_chart")
        if "cached blocks" in json.loads(chart.proto.spec)["layout"]["title"]["text"]
    ]
    labels = list(bars["y"])
    assert len(labels) == len(set(labels)) == 20  # one category per bar: none drawn twice
    # The sample's most-hit blocks are Initech's system prompt, 147 hits each: one bar.
    assert labels[0].startswith("“You are Initech's internal help desk assist…” · ")
    assert " blocks, pos 0-" in labels[0]
    assert any("(branch 2)" in label for label in labels)
