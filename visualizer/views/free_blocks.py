"""Free-block timeline: how close the pool ran to empty, what it evicted meanwhile, and what
evicted what (prefix families or tenants), with the evictions regretted most."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from collector.charts.theme import on_wall_clock, per_point
from collector.model.family_names import name_of
from collector.model.nicknames import with_nicknames
from collector.model.time_window import TimeWindow
from collector.queries import activity, evictions
from collector.queries.config import run_config
from collector.queries.pool import (
    LOW_FREE_FRACTION,
    free_block_extremes,
    low_free_periods,
    pool_timeline,
)
from collector.store.run_file import RunFile
from visualizer.charts.evictions import eviction_matrix_figure, top_cells
from visualizer.charts.free_blocks import free_blocks_figure
from visualizer.downloads import show_chart
from visualizer.family_labels import named_families
from visualizer.metrics import metric_row
from visualizer.sidebar import controls
from visualizer.sidebar.time_filter import window_caption
from visualizer.wall_clock import chart_origin

MARKER_POINTS = 400
EVICTION_POINTS = 80
TOP_SIDES = 8  # rows and columns of the eviction matrix; the rest fold into "(others)"
TOP_REGRETTED = 10
AXIS_NAMES = {"family": "prefix family", "tenant": "tenant"}


def render() -> None:
    run, window = controls.render()
    config = run_config(run)
    num_usable = int(config["num_blocks"]) - 1
    timeline = pool_timeline(run, window=window)
    low_periods = low_free_periods(run, window=window)
    points = activity.figures_over_time(run, window, max_points=MARKER_POINTS)
    # Evictions come by the thousand: fewer, larger marks keep them apart.
    coarse = activity.figures_over_time(run, window, max_points=EVICTION_POINTS)
    st.title("Free-block timeline")
    st.caption(f"Showing {window_caption(window, run)}.")
    if timeline.empty:
        st.info("No pool snapshot in this time range.")
        return
    figure = free_blocks_figure(
        timeline,
        evictions=_marks(coarse, "evictions"),
        preemptions=_marks(points, "preemptions"),
        low_periods=low_periods,
        num_usable_blocks=num_usable,
        alarm_fraction=LOW_FREE_FRACTION,
    )
    origin = chart_origin(run)
    show_chart(on_wall_clock(figure, origin), timeline, key="free_blocks_timeline")
    st.caption(
        "In use at the bottom, then cached but free (evictable: a hit brings it back), then "
        "free with no cached content. The dashed line is 10 % free; shaded stretches are "
        f"under it. Triangles mark {per_point(coarse, 'evictions')} (larger for more), "
        "crosses preemptions."
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
        if origin is not None:  # a run longer than a day: when each began, on the wall clock
            began = pd.Timestamp(origin) + pd.to_timedelta(low_periods["start_s"], unit="s")
            low_periods.insert(0, "from (UTC)", began.dt.strftime("%a %d %b %H:%M:%S"))
        st.dataframe(low_periods, hide_index=True, key="free_blocks_low_periods")
    _what_evicts_what(run, window)


def _what_evicts_what(run: RunFile, window: TimeWindow) -> None:
    st.subheader("What evicts what")
    axis: evictions.Axis = st.radio(
        "Rows and columns by",
        evictions.AXES,
        format_func=AXIS_NAMES.__getitem__,
        horizontal=True,
        key="free_blocks_eviction_axis",
    )
    matrix = evictions.eviction_matrix(run, window, axis)
    if matrix.empty:
        st.info("Nothing was evicted in this time range.")
        return
    cells = top_cells(_labelled(run, matrix, axis), TOP_SIDES)
    title = f"Blocks evicted, by evicting x evicted {AXIS_NAMES[axis]}"
    show_chart(eviction_matrix_figure(cells, title), cells, key="free_blocks_eviction_matrix")
    st.caption(
        "A cell counts the blocks in this range that the row's requests took from the pool "
        "while they still held the column's cached prefixes. A prefix family is every block "
        "under one first block, named by the first words of its text where the run recorded "
        "them, else by the tenant and request that first stored it (its hash is in the "
        f"download). Beyond the {TOP_SIDES} largest, rows and columns fold into "
        "(others)."
    )
    regretted = with_nicknames(evictions.regretted_families(run, window, TOP_REGRETTED), "owner")
    if regretted.empty:
        st.caption("No block evicted in this range was needed again.")
        return
    st.markdown("**Most-regretted prefixes**: evicted, then needed again (stored again)")
    names = named_families(run, regretted["family"].tolist())
    table = pd.DataFrame(
        {
            "prefix family": [name_of(names, root) for root in regretted["family"]],
            "blocks evicted": regretted["evictions"],
            "needed again": regretted["needed_again"],
            "share needed again": regretted["regret_share"].map("{:.0%}".format),
            "median time until needed (s)": regretted["median_needed_again_s"].round(2),
        }
    )
    st.dataframe(table, hide_index=True, key="free_blocks_regretted")


def _labelled(run: RunFile, matrix: pd.DataFrame, axis: evictions.Axis) -> pd.DataFrame:
    """The matrix's cells with their rows and columns named."""
    # Pseudonymous tenants by their nicknames: the families' owners, or the tenants.
    named = ("evicting_owner", "evicted_owner") if axis == "family" else ("evicting", "evicted")
    matrix = with_nicknames(matrix, *named)
    if axis == "family":
        names = named_families(run, [*matrix["evicting"].dropna(), *matrix["evicted"].dropna()])
        evicting = [name_of(names, root, "(no request)") for root in matrix["evicting"]]
        evicted = [
            name_of(names, root, "(unknown: its store was lost)") for root in matrix["evicted"]
        ]
    else:
        evicting = matrix["evicting"].fillna("(no tenant)").tolist()
        evicted = matrix["evicted"].fillna("(no tenant)").tolist()
    return pd.DataFrame(
        {"evicting": evicting, "evicted": evicted, "evictions": matrix["evictions"]}
    )


def _marks(points: pd.DataFrame, column: str) -> pd.DataFrame:
    """The points where `column` happened, as (t_s, count) markers."""
    marked = points.loc[points[column] > 0, ["t_s", column]]
    return marked.rename(columns={column: "count"})


if __name__ == "__main__":
    render()
