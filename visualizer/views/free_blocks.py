"""Free-block timeline: how close the pool ran to empty, and what it evicted meanwhile."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from collector.queries import activity
from collector.queries.config import run_config
from collector.queries.pool import (
    LOW_FREE_FRACTION,
    free_block_extremes,
    low_free_periods,
    pool_timeline,
)
from visualizer.charts.free_blocks import free_blocks_figure
from visualizer.downloads import show_chart
from visualizer.metrics import metric_row
from visualizer.sidebar import controls
from visualizer.sidebar.time_filter import window_caption

MARKER_POINTS = 400


def render() -> None:
    run, window = controls.render()
    config = run_config(run)
    num_usable = int(config["num_blocks"]) - 1
    timeline = pool_timeline(run, window=window)
    low_periods = low_free_periods(run, window=window)
    points = activity.figures_over_time(run, window, max_points=MARKER_POINTS)
    st.title("Free-block timeline")
    st.caption(f"Showing {window_caption(window, run)}.")
    if timeline.empty:
        st.info("No pool snapshot in this time range.")
        return
    figure = free_blocks_figure(
        timeline,
        evictions=_marks(points, "evictions"),
        preemptions=_marks(points, "preemptions"),
        low_periods=low_periods,
        num_usable_blocks=num_usable,
        alarm_fraction=LOW_FREE_FRACTION,
    )
    show_chart(figure, timeline, key="free_blocks_timeline")
    st.caption(
        "In use at the bottom, then cached but free (evictable: a hit brings it back), then "
        "free with no cached content. The dashed line is 10 % free; shaded stretches are "
        "under it. Triangles mark evictions, crosses preemptions."
    )
    extremes = free_block_extremes(run, window=window)
    metric_row(
        {
            "Fewest free blocks": f"{extremes['min_free_blocks']:,} of {num_usable:,}",
            "Stretches under 10 % free": f"{len(low_periods):,}",
            "Time under 10 % free": f"{extremes['low_free_s']:.1f} s",
            "Steps under 10 % free": f"{extremes['low_free_step_share']:.1%}",
        }
    )
    if not low_periods.empty:
        st.dataframe(low_periods, hide_index=True, key="free_blocks_low_periods")


def _marks(points: pd.DataFrame, column: str) -> pd.DataFrame:
    """The points where `column` happened, as (t_s, count) markers."""
    marked = points.loc[points[column] > 0, ["t_s", column]]
    return marked.rename(columns={column: "count"})


if __name__ == "__main__":
    render()
