"""Free-block timeline: how close the pool ran to empty, and what it evicted meanwhile."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from collector import activity, queries
from visualizer import charts, controls
from visualizer.downloads import show_chart
from visualizer.time_filter import window_caption

ALARM_FRACTION = 0.10
MARKER_POINTS = 400


def render() -> None:
    connection, window = controls.render()
    config = queries.run_config(connection)
    num_usable = int(config["num_blocks"]) - 1
    timeline = queries.pool_timeline(connection, window=window)
    low_periods = queries.low_free_periods(connection, ALARM_FRACTION, window)
    points = activity.figures_over_time(connection, window, max_points=MARKER_POINTS)
    st.title("Free-block timeline")
    st.caption(f"Showing {window_caption(window, connection)}.")
    if timeline.empty:
        st.info("No pool snapshot in this time range.")
        return
    figure = charts.free_blocks_figure(
        timeline,
        evictions=_marks(points, "evictions"),
        preemptions=_marks(points, "preemptions"),
        low_periods=low_periods,
        num_usable_blocks=num_usable,
        alarm_fraction=ALARM_FRACTION,
    )
    show_chart(figure, timeline, key="free_blocks_timeline")
    st.caption(
        "In use at the bottom, then cached but free (evictable: a hit brings it back), then "
        "free with no cached content. The dashed line is 10 % free; shaded stretches are "
        "under it. Triangles mark evictions, crosses preemptions."
    )
    extremes = queries.free_block_extremes(connection, ALARM_FRACTION, window)
    time_low = float((low_periods["end_s"] - low_periods["start_s"]).sum())
    first, second, third, fourth = st.columns(4)
    first.metric("Fewest free blocks", f"{extremes['min_free_blocks']:,} of {num_usable:,}")
    second.metric("Stretches under 10 % free", f"{len(low_periods):,}")
    third.metric("Time under 10 % free", f"{time_low:.1f} s")
    fourth.metric("Steps under 10 % free", f"{extremes['low_free_step_share']:.1%}")
    if not low_periods.empty:
        st.dataframe(low_periods, hide_index=True, key="free_blocks_low_periods")


def _marks(points: pd.DataFrame, column: str) -> pd.DataFrame:
    """The points where `column` happened, as (t_s, count) markers."""
    marked = points.loc[points[column] > 0, ["t_s", column]]
    return marked.rename(columns={column: "count"})


if __name__ == "__main__":
    render()
