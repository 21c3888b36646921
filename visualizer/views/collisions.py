"""Collisions: every block whose hash matched another prompt's content, with both requests;
none found is a result too, stated with the hash and the hits checked."""

from __future__ import annotations

import streamlit as st

from collector.charts.theme import on_wall_clock
from collector.queries import activity, collisions
from visualizer.charts.collisions import collision_checks_figure
from visualizer.downloads import show_chart
from visualizer.sidebar import controls
from visualizer.sidebar.time_filter import window_caption
from visualizer.wall_clock import chart_origin


def render() -> None:
    run, window = controls.render()
    check = collisions.collision_check(run, window)
    st.title("Collisions")
    st.caption(
        f"Showing {window_caption(window, run)}. A collision is a wrong reuse: a "
        "block hash matched but the block's content (an independent fingerprint of parent, "
        "tokens and extra keys) did not, so a request was served another prompt's KV."
    )
    found, checked, algorithm = check["collisions"], check["hits_checked"], check["hash_algo"]
    if not check["checked"]:
        st.warning(
            "This run was recorded without the collision check, so no hit was checked. "
            "It is on by default; this run was recorded with `KVSCOPE_CHECK_COLLISIONS=0`, "
            "`kvscope replay --no-check-collisions`, or by a kvscope from before it was on "
            "for every hash."
        )
    elif found == 0:
        st.success(f"No collisions: 0 in {checked:,} block hits checked (hash: {algorithm}).")
    else:
        st.error(f"{found:,} collisions in {checked:,} block hits checked (hash: {algorithm}).")
    points = activity.figures_over_time(run, window)
    if points.empty:
        return
    show_chart(
        on_wall_clock(collision_checks_figure(points, algorithm), chart_origin(run)),
        points[["t_s", "block_hits", "collisions"]],
        key="collisions_checks",
    )
    rows = collisions.collision_rows(run, window)
    if not rows.empty:
        st.subheader("Every collision")
        st.dataframe(rows, hide_index=True, key="collisions_table")


if __name__ == "__main__":
    render()
