"""Hotspots: which blocks are hot and when (block x time heatmap), the most-hit, -stored or
-evicted blocks, and how skewed reuse is."""

from __future__ import annotations

from typing import Any

import streamlit as st

from collector.queries import hotspots, kv_groups
from collector.queries.timeline import time_grid
from visualizer.charts import hotspots as hotspot_charts
from visualizer.downloads import show_chart
from visualizer.metrics import metric_row
from visualizer.sidebar import controls
from visualizer.sidebar.time_filter import window_caption

TOP_BLOCKS = 20


def render() -> None:
    run, window = controls.render()
    st.title("Hotspots")
    st.caption(f"Showing {window_caption(window, run)}.")
    group = _group_picker(kv_groups.layout(run))
    heat = hotspots.block_heatmap(run, window, kv_group=group)
    if heat.empty:
        st.info("No block was hit, stored or evicted in this time range.")
        return
    measure = st.radio(
        "Heatmap shows", hotspots.HEAT_MEASURES, horizontal=True, key="hotspots_measure"
    )
    figure = hotspot_charts.heatmap_figure(heat, measure, time_grid(run).block_bin_size)
    show_chart(figure, heat, key="hotspots_heatmap")
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
        top = hotspots.top_blocks(run, window, TOP_BLOCKS, measure=ranked_by)
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
    st.dataframe(top, hide_index=True, key="hotspots_top_table")


def _group_picker(groups: list[dict[str, Any]]) -> int | None:
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
