"""Overview: the run's health scorecard (visualizer/health_card.py); why the window's prompts
missed (visualizer/miss_breakdown.py); the run's hit rates, tokens saved, requests, pool
pressure (the fewest free blocks, the time under 10 % free, preemptions), evictions,
collisions and dropped events; TTFT and queue time by hit share (visualizer/latency_section.py);
its configuration, and the same figures over time."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from collector.charts.theme import on_wall_clock
from collector.model.time_window import TimeWindow
from collector.queries import activity
from collector.queries.activity import WindowFigures
from collector.queries.collisions import collision_check
from collector.queries.config import describe_source, run_config
from collector.queries.fleet import engine_lineages, engine_starts
from collector.queries.pool import LOW_FREE_FRACTION, FreeBlockExtremes, free_block_extremes
from collector.queries.summary import capture_stops, hit_ratio
from collector.queries.timeline import run_calendar
from collector.safe_text import markdown_text
from collector.store.run_file import RunFile
from visualizer import (
    day_comparison,
    engine_markers,
    engine_pools,
    health_card,
    latency_section,
    miss_breakdown,
    page_selection,
    run_settings,
)
from visualizer.charts import overview as overview_charts
from visualizer.downloads import show_chart
from visualizer.metrics import metric_row
from visualizer.run_source import current_run
from visualizer.sidebar import controls
from visualizer.sidebar.time_filter import window_caption
from visualizer.wall_clock import chart_origin


def render() -> None:
    path = current_run()
    run, window = controls.render()
    figures = activity.window_figures(run, window)
    config = run_config(run)
    st.title("Overview")
    starts = engine_starts(run)
    pools = engine_pools.pool_words(starts, config, engine_lineages(run))
    st.caption(  # Streamlit draws a caption as Markdown: the run's own words are escaped
        f"{markdown_text(path.name)}: {markdown_text(describe_source(config), None)}, "
        f"{markdown_text(pools, None)}, "
        f"{markdown_text(config['hash_algo'])}, vLLM {markdown_text(config['vllm_version'])}. "
        f"Showing {window_caption(window, run)}."
    )
    left_out = page_selection.note(page_selection.current_features())
    if left_out:
        st.caption(left_out)
    stopped = capture_stops(run)
    if stopped:
        st.warning(
            "Capture stopped during this run (a failure in kvscope's hooks; vLLM ran on, "
            f"uncaptured from then on): {markdown_text(stopped, None)}"
        )
    health_card.render(path)
    miss_breakdown.render(run, window)
    _metrics(figures, free_block_extremes(run, window=window))
    day_comparison.render(run, window)
    latency_section.render(run)
    points = activity.figures_over_time(run, window)
    if points.empty:
        st.info("Nothing happened in this time range.")
    markers = engine_markers.engine_markers(starts, window)
    if not markers.empty:
        st.caption(
            "Engines started (a restart or a new engine: the settings may have changed): "
            + markdown_text(engine_markers.marker_words(markers, run_calendar(run)), None)
        )
    left, right = st.columns(2)
    origin = chart_origin(run)
    if not points.empty:
        with left:
            figure = overview_charts.with_markers(overview_charts.hit_rate_figure(points), markers)
            show_chart(on_wall_clock(figure, origin), points, key="overview_hit_rate")
            figure = overview_charts.activity_figure(points)
            show_chart(on_wall_clock(figure, origin), points, key="overview_activity")
            _integrity(run, window, points)
        with right:
            figure = overview_charts.tokens_saved_figure(points)
            show_chart(on_wall_clock(figure, origin), points, key="overview_tokens")
            figure = overview_charts.block_events_figure(points)
            show_chart(on_wall_clock(figure, origin), points, key="overview_blocks")
    with right:
        run_settings.render(run, config, starts)


def _metrics(figures: WindowFigures, pool: FreeBlockExtremes) -> None:
    metric_row(
        {
            "Hit ratio (tokens)": f"{figures['token_hit_ratio']:.1%}",
            "Hit ratio (blocks)": f"{figures['block_hit_ratio']:.1%}",
            "Tokens saved": f"{figures['hit_tokens']:,}",
            "Requests": f"{figures['requests']:,}",
        },
        {"Tokens saved": "prompt tokens served from the prefix cache instead of recomputed"},
    )
    if figures["tier_hit_tokens"]:
        _tier_metrics(figures)
    usable = pool["usable_blocks"]
    low = f"Time under {LOW_FREE_FRACTION * 100:.0f} % free"
    metric_row(
        {
            "Fewest free blocks": (
                f"{pool['min_free_blocks']:,} of {usable:,}"
                f" ({pool['min_free_blocks'] / usable:.1%})"
                if usable
                else "no pool steps"
            ),
            low: f"{pool['low_free_s']:,.1f} s ({pool['low_free_time_share']:.0%})",
            "Preemptions": f"{figures['preemptions']:,}",
        },
        {
            "Fewest free blocks": (
                "free blocks (cached-but-free included) at the pool's fullest step: at 0 the "
                "next request waits or preempts another"
            ),
            low: "of the time the pool steps cover",
            "Preemptions": "requests whose blocks vLLM freed to make room, their prefill redone",
        },
    )
    metric_row(
        {
            "Evictions": f"{figures['evictions']:,}",
            "Collisions": f"{figures['collisions']:,}",
            "Dropped events": f"{figures['dropped_events']:,}",
        },
        {
            "Collisions": f"in {figures['block_hits']:,} block hits checked",
            "Dropped events": (
                f"records lost by the capture buffer, of {figures['events']:,} recorded"
            ),
        },
    )


def _tier_metrics(figures: WindowFigures) -> None:
    """GPU-pool hits and an offload tier's apart (a run with a CPU tier: replayed with one,
    or captured from an engine whose KV connector loaded blocks)."""
    prompt_tokens = figures["prompt_tokens"]
    tier_tokens = figures["tier_hit_tokens"]
    metric_row(
        {
            "GPU-pool hits (tokens)": f"{figures['token_hit_ratio']:.1%}",
            "CPU-tier hits (tokens)": f"{hit_ratio(tier_tokens, prompt_tokens):.1%}",
            "Not recomputed, both": (
                f"{hit_ratio(figures['hit_tokens'] + tier_tokens, prompt_tokens):.1%}"
            ),
            "Tokens loaded from the tier": f"{tier_tokens:,}",
        },
        {
            "GPU-pool hits (tokens)": "vLLM's prefix cache hit ratio: the hit ratios above",
            "CPU-tier hits (tokens)": (
                "prompt tokens after the GPU hit that the KV connector loaded back from the "
                "offload tier instead of computing them"
            ),
            "Not recomputed, both": "GPU-pool hits and tier hits together",
        },
    )


def _integrity(run: RunFile, window: TimeWindow, points: pd.DataFrame) -> None:
    """A badge when nothing went wrong (a flat zero line says no more), else the chart."""
    if points["collisions"].sum() or points["dropped_events"].sum():
        figure = on_wall_clock(overview_charts.integrity_figure(points), chart_origin(run))
        show_chart(figure, points, key="overview_integrity")
        return
    check = collision_check(run, window)
    collisions = (
        f"0 collisions in {check['hits_checked']:,} block hits checked"
        if check["checked"]
        else f"collisions not checked (the check was off, {check['hash_algo']} hashes)"
    )
    st.success(f"Integrity: {collisions}; 0 dropped events.")


if __name__ == "__main__":
    render()
