"""Free-block timeline: how close the pool ran to empty, and what it evicted meanwhile."""

from __future__ import annotations

import streamlit as st

from collector import queries
from visualizer import charts
from visualizer.run_source import connect, current_run

ALARM_FRACTION = 0.10


def render() -> None:
    connection = connect(current_run())
    config = queries.run_config(connection)
    num_usable = int(config["num_blocks"]) - 1
    timeline = queries.pool_timeline(connection)
    low_periods = queries.low_free_periods(connection, ALARM_FRACTION)
    st.title("Free-block timeline")
    figure = charts.free_blocks_figure(
        timeline,
        evictions=queries.event_times(connection, "evict"),
        preemptions=queries.event_times(connection, "preempt"),
        low_periods=low_periods,
        num_usable_blocks=num_usable,
        alarm_fraction=ALARM_FRACTION,
    )
    st.plotly_chart(figure, key="free_blocks_timeline")
    time_low = float((low_periods["end_s"] - low_periods["start_s"]).sum())
    first, second, third = st.columns(3)
    first.metric("Fewest free blocks", f"{int(timeline['free'].min()):,} of {num_usable:,}")
    second.metric("Stretches under 10 % free", f"{len(low_periods):,}")
    third.metric("Time under 10 % free", f"{time_low:.1f} s")
    if not low_periods.empty:
        st.dataframe(low_periods, hide_index=True, key="free_blocks_low_periods")


if __name__ == "__main__":
    render()
