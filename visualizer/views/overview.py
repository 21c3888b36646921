"""Overview: the run's hit rates, tokens saved, requests, evictions, collisions and dropped
events, its configuration, and the same figures over time."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from collector import activity, queries
from visualizer import charts, controls
from visualizer.charts import overview as overview_charts
from visualizer.downloads import show_chart
from visualizer.run_source import current_run
from visualizer.time_filter import window_caption


def render() -> None:
    path = current_run()
    connection, window = controls.render()
    figures = activity.window_figures(connection, window)
    config = queries.run_config(connection)
    st.title("Overview")
    st.caption(
        f"{path.name}: {queries.describe_source(config)}, "
        f"block size {config['block_size']}, {config['num_blocks']:,} blocks, "
        f"{config['hash_algo']}, vLLM {config['vllm_version']}. "
        f"Showing {window_caption(window, connection)}."
    )
    _metrics(figures)
    points = activity.figures_over_time(connection, window)
    if points.empty:
        st.info("Nothing happened in this time range.")
    left, right = st.columns(2)
    if not points.empty:
        with left:
            show_chart(charts.hit_rate_figure(points), points, key="overview_hit_rate")
            show_chart(charts.activity_figure(points), points, key="overview_activity")
            figure = overview_charts.integrity_figure(points)
            show_chart(figure, points, key="overview_integrity")
        with right:
            figure = overview_charts.tokens_saved_figure(points)
            show_chart(figure, points, key="overview_tokens")
            figure = overview_charts.block_events_figure(points)
            show_chart(figure, points, key="overview_blocks")
    with right:
        st.subheader("Run configuration")
        rows = _config_rows(config)
        st.dataframe(rows, hide_index=True, height=35 * (len(rows) + 1) + 3, key="overview_config")


def _metrics(figures: dict[str, Any]) -> None:
    first, second, third, fourth = st.columns(4)
    first.metric("Hit ratio (tokens)", f"{figures['token_hit_ratio']:.1%}")
    second.metric("Hit ratio (blocks)", f"{figures['block_hit_ratio']:.1%}")
    third.metric(
        "Tokens saved",
        f"{figures['hit_tokens']:,}",
        help="prompt tokens served from the prefix cache instead of recomputed",
    )
    fourth.metric("Requests", f"{figures['requests']:,}")
    first, second, third, fourth = st.columns(4)
    first.metric("Evictions", f"{figures['evictions']:,}")
    second.metric("Preemptions", f"{figures['preemptions']:,}")
    third.metric(
        "Collisions",
        f"{figures['collisions']:,}",
        help=f"in {figures['block_hits']:,} block hits checked",
    )
    fourth.metric(
        "Dropped events",
        f"{figures['dropped_events']:,}",
        help=f"records lost by the capture buffer, of {figures['events']:,} recorded",
    )


def _config_rows(config: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(
        {"setting": list(config), "value": ["" if v is None else str(v) for v in config.values()]}
    )


if __name__ == "__main__":
    render()
