"""Hotspots: which blocks are hot and when (block x time heatmap), the most-hit, -stored or
-evicted blocks, and how skewed reuse is."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import streamlit as st

from collector.charts.theme import on_wall_clock
from collector.model.nicknames import with_nicknames
from collector.model.time_window import TimeWindow
from collector.queries import hotspots, kv_groups
from collector.queries.timeline import time_grid
from collector.store.run_file import RunFile
from engine_hooks.layout import KvGroup
from visualizer.charts import hotspots as hotspot_charts
from visualizer.downloads import show_chart
from visualizer.family_labels import named_families
from visualizer.metrics import metric_row
from visualizer.sidebar import controls
from visualizer.sidebar.time_filter import window_caption
from visualizer.wall_clock import chart_origin

TOP_BLOCKS = 20  # bars: runs of blocks alike
BLOCKS_FETCHED = 400  # the most-hit blocks folded into those runs
MOST_ACTIVE_ROWS = 20
ROW_NAMES = {"family": "prefix family", "tenant": "tenant", "block": "block id"}


def render() -> None:
    run, window = controls.render()
    st.title("Hotspots")
    st.caption(f"Showing {window_caption(window, run)}.")
    group = _group_picker(kv_groups.layout(run))
    heat = hotspots.block_heatmap(run, window, kv_group=group)
    if heat.empty:
        st.info("No block was hit, stored or evicted in this time range.")
        return
    _show_heatmap(run, window, heat, group)
    _show_reuse(run, window, group)


def _show_heatmap(run: RunFile, window: TimeWindow, heat: pd.DataFrame, group: int | None) -> None:
    """The heatmap, one row per block bin, prefix family or tenant, of the measure picked."""
    left, right = st.columns(2)
    measure = left.radio(
        "Heatmap shows", hotspots.HEAT_MEASURES, horizontal=True, key="hotspots_measure"
    )
    rows = right.radio(
        "One row per",
        ROW_NAMES,
        format_func=ROW_NAMES.get,
        horizontal=True,
        key="hotspots_rows",
        help="Block ids are where vLLM put the blocks; prefix families (every block under "
        "one first block) and tenants (who first stored each block) are whose they are",
    )
    if rows == "block":
        figure = hotspot_charts.heatmap_figure(heat, measure, time_grid(run).block_bin_size)
        show_chart(on_wall_clock(figure, chart_origin(run)), heat, key="hotspots_heatmap")
    else:
        by: hotspots.HeatRows = "family" if rows == "family" else "tenant"
        owned = _named_rows(run, hotspots.owner_heatmap(run, window, by, MOST_ACTIVE_ROWS), rows)
        figure = hotspot_charts.owner_heatmap_figure(owned, measure, ROW_NAMES[rows])
        show_chart(on_wall_clock(figure, chart_origin(run)), owned, key="hotspots_heatmap")
        if group is not None:
            st.caption("Families and tenants are counted on the reference KV cache group.")


def _show_reuse(run: RunFile, window: TimeWindow, group: int | None) -> None:
    """How skewed reuse is, and the most-hit, -stored or -evicted blocks."""
    frequencies = hotspots.hit_count_frequencies(run, window, kv_group=group)
    skew = hotspots.reuse_skew(frequencies)
    metric_row(
        {
            "Blocks cached in this range": f"{skew['blocks']:,}",
            "Hits to the top 1 % of them": f"{skew['top_1pct_hit_share']:.1%}",
            "Hits to the top 10 %": f"{skew['top_10pct_hit_share']:.1%}",
            "Never hit while cached": f"{skew['never_hit_share']:.1%}",
        }
    )
    st.caption(
        "Reuse counts each time a block was cached (stored), with the hits it got before it "
        "was evicted or the run ended; the most-hit, -stored or -evicted blocks below count "
        "in this range."
    )
    histogram = hotspots.hit_count_histogram(frequencies)
    left, right = st.columns(2)
    with left:
        ranked_by = st.radio(
            "Most ... blocks",
            hotspots.HEAT_MEASURES,
            format_func=lambda measure: hotspot_charts.TOP_TITLES[measure].removeprefix("Most-"),
            horizontal=True,
            key="hotspots_top_measure",
        )
        top = _block_runs(run, window, ranked_by)
        show_chart(hotspot_charts.top_blocks_figure(top, ranked_by), top, key="hotspots_top_blocks")
    with right:
        show_chart(
            hotspot_charts.hit_histogram_figure(histogram), histogram, key="hotspots_histogram"
        )
        show_chart(
            hotspot_charts.concentration_figure(frequencies),
            frequencies,
            key="hotspots_concentration",
        )
    st.subheader(f"{hotspot_charts.TOP_TITLES[ranked_by]} blocks")
    st.caption(
        "A row per run of blocks alike: the blocks of one prefix family with the same counts "
        "(a shared prefix's blocks are hit together), each block counted on its own."
    )
    st.dataframe(
        top[["label", "blocks", "hits", "stores", "evictions", "tenant", "first_hash"]].rename(
            columns={"label": "prefix family · positions", "first_hash": "first block hash"}
        ),
        hide_index=True,
        key="hotspots_top_table",
    )


def _block_runs(run: RunFile, window: TimeWindow, measure: str) -> pd.DataFrame:
    """The TOP_BLOCKS runs of blocks alike with the most `measure`, each labelled by its
    family's name and its positions."""
    top = with_nicknames(
        hotspots.top_blocks(run, window, BLOCKS_FETCHED, measure=measure), "tenant"
    )
    runs = hotspots.block_runs(top, measure, TOP_BLOCKS)
    names = named_families(run, runs["family"])
    labels = []
    for family, first, last, blocks in zip(
        runs["family"], runs["first_position"], runs["last_position"], runs["blocks"], strict=True
    ):
        name = names.get(int(family), "(unknown family)") if family else "(unknown family)"
        where = f"pos {first}" if blocks == 1 else f"{blocks} blocks, pos {first}-{last}"
        labels.append(f"{name} · {where}")
    return runs.assign(label=branches_apart(labels))


def branches_apart(labels: list[str]) -> list[str]:
    """Labels made unique: blocks at one position of one family are branches of its prefix
    (different text after a shared start), numbered "branch 2", "branch 3", ... after the
    first (a chart's category axis would draw same-named bars as one)."""
    seen: Counter[str] = Counter()
    unique = []
    for label in labels:
        seen[label] += 1
        unique.append(label if seen[label] == 1 else f"{label} (branch {seen[label]})")
    return unique


def _named_rows(run: RunFile, heat: pd.DataFrame, rows: str) -> pd.DataFrame:
    """The owner heatmap with each row named: a family by its name (collector/model/
    family_names.py), a tenant by its nickname; the folded rest as "(every other prefix
    family)" or "(every other tenant)"."""
    named = with_nicknames(heat, "owner" if rows == "family" else "row_key")
    others = f"(every other {ROW_NAMES[rows]})"
    if rows == "family":
        names = named_families(run, named["row_key"])
        labels = [
            names.get(int(key), key) if isinstance(key, str) and key.isdigit() else key
            for key in named["row_key"]
        ]
    else:
        labels = named["row_key"].tolist()
    return named.assign(row=[others if pd.isna(label) else label for label in labels])


def _group_picker(groups: list[KvGroup]) -> int | None:
    """For a run of several KV cache groups, the group whose blocks the heatmap and the reuse
    figures show (None: every group's); the most-hit blocks are the reference group's."""
    if len(groups) == 1:
        return None
    names = {None: "every group"} | {
        index: f"group {index}: {kv_groups.describe(group)}" for index, group in enumerate(groups)
    }
    picked: int | None = st.selectbox(
        "KV cache group", list(names), format_func=names.__getitem__, key="hotspots_kv_group"
    )
    st.caption(
        "This model has several KV cache groups drawing blocks from one pool. The most-hit "
        "blocks count the first full-attention group's hits, where a prefix is reused whole."
    )
    return picked


if __name__ == "__main__":
    render()
