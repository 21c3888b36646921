"""Fleet: a run of several engines side by side: each engine's load, hits and pool pressure,
how unevenly the load spread, and the blocks cached on more than one engine at once with the
memory those extra copies take."""

from __future__ import annotations

from dataclasses import asdict

import pandas as pd
import streamlit as st

from collector.charts.theme import on_wall_clock
from collector.model.kv_memory import MODELS, KVSpec, gib_for_blocks
from collector.model.time_window import TimeWindow
from collector.queries import fleet
from collector.queries.config import run_config
from collector.queries.pool import LOW_FREE_FRACTION
from collector.store.run_file import RunFile
from visualizer.charts import fleet as fleet_charts
from visualizer.downloads import show_chart
from visualizer.kv_spec_inputs import model_and_dtype
from visualizer.metrics import metric_row
from visualizer.sidebar import controls
from visualizer.sidebar.time_filter import window_caption
from visualizer.wall_clock import chart_origin

ONE_ENGINE_NOTE = (
    "This page needs a run with several engines (engine ids or data-parallel ranks): a fleet "
    "replay, a live capture of several engines, or several collectors' Parquet exports opened "
    "together. This run has one, so every figure on the other pages is that engine's."
)


def render() -> None:
    run, window = controls.render()
    st.title("Fleet")
    st.caption(f"Showing {window_caption(window, run)}.")
    if fleet.num_engines(run) < 2:
        st.info(ONE_ENGINE_NOTE)
        return
    spec = _spec()
    gib_per_block = gib_for_blocks(spec, int(run_config(run)["block_size"]), 1)
    engines = fleet.fleet_engines(run, window)
    if engines.empty:
        st.info("Nothing happened in this time range.")
        return
    summary = fleet.duplication_summary(run, gib_per_block, window)
    _headline(engines, summary)
    left, right = st.columns(2)
    with left:
        hit_ratios = fleet_charts.engine_hit_ratio_figure(engines)
        show_chart(hit_ratios, engines, key="fleet_hit_ratio")
    with right:
        show_chart(fleet_charts.engine_requests_figure(engines), engines, key="fleet_requests")
    st.dataframe(_engine_table(engines), hide_index=True, key="fleet_engines")
    _pool_pressure(run, window)
    _duplication(run, window, gib_per_block, summary, spec)


def _spec() -> KVSpec:
    """The model KV spec the GiB figures assume; the user can change it."""
    with st.expander("Assumption: model KV spec (for the GiB figures)", expanded=False):
        first, second = st.columns(2)
        model, dtype = model_and_dtype(first, second, "fleet")
    return KVSpec(**{**asdict(MODELS[model]), "dtype": dtype})


def _headline(engines: pd.DataFrame, summary: fleet.DuplicationSummary) -> None:
    prompt_tokens = int(engines["prompt_tokens"].sum())
    hit_ratio = int(engines["hit_tokens"].sum()) / prompt_tokens if prompt_tokens else 0.0
    imbalance = fleet.load_imbalance(engines)
    metric_row(
        {
            "Engines": f"{len(engines):,}",
            "Fleet hit ratio (tokens)": f"{hit_ratio:.1%}",
            "Load imbalance (requests)": f"{imbalance['requests']:.2f}x",
            "Peak duplicated": f"{summary['peak_duplicated_gib']:.3g} GiB",
        },
        {
            "Engines": "Engine ids x data-parallel ranks with records in this range.",
            "Fleet hit ratio (tokens)": "Hit tokens over prompt tokens of every engine's "
            "requests admitted for the first time.",
            "Load imbalance (requests)": "The busiest engine's requests over the mean per "
            f"engine (1.00x: even). Prompt tokens: {imbalance['prompt_tokens']:.2f}x.",
            "Peak duplicated": f"{summary['peak_duplicated_blocks']:,} blocks: the most extra "
            "copies at one moment, blocks cached on an engine while another engine holds the "
            "same hash (copies beyond the first engine's), and the memory they take at the "
            "assumed KV spec.",
        },
    )


def _engine_table(engines: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "engine": engines["engine"],
            "requests": engines["requests"],
            "prompt tokens": engines["prompt_tokens"],
            "hit tokens": engines["hit_tokens"],
            "hit ratio": engines["hit_ratio"].map("{:.1%}".format),
            "evictions": engines["evictions"],
            "least free": engines["min_free_share"].map("{:.1%}".format, na_action="ignore"),
            "time under 10 % free": engines["low_free_time_share"].map("{:.1%}".format),
        }
    )


def _pool_pressure(run: RunFile, window: TimeWindow) -> None:
    timeline = fleet.free_share_timeline(run, window)
    if timeline.empty:
        return
    figure = on_wall_clock(
        fleet_charts.free_share_figure(timeline, LOW_FREE_FRACTION), chart_origin(run)
    )
    show_chart(figure, timeline, key="fleet_free_share")
    st.caption(
        "Each point is the engine's fullest moment in its stretch of time. An engine that "
        "runs under the dashed line while another has room is a routing problem, not a "
        "cache-size one."
    )


def _duplication(
    run: RunFile,
    window: TimeWindow,
    gib_per_block: float,
    summary: fleet.DuplicationSummary,
    spec: KVSpec,
) -> None:
    st.subheader("Cross-replica duplication")
    over_time = fleet.fleet_duplication(run, gib_per_block, window)
    if over_time.empty:
        st.info("No block was cached in this time range.")
        return
    figure = on_wall_clock(fleet_charts.duplication_figure(over_time), chart_origin(run))
    show_chart(figure, over_time, key="fleet_duplication")
    st.caption(
        "A block hash is cached on an engine from its store until that block's eviction or "
        "the engine's reset. Extra copies: per hash, the engines holding it at once, less "
        f"one. On average {summary['mean_duplicated_blocks']:,.1f} blocks "
        f"({summary['mean_share']:.1%} of the fleet's cached blocks, "
        f"{summary['mean_duplicated_gib']:.3g} GiB) were extra copies; at the peak "
        f"{summary['peak_share']:.1%}. Each point is its stretch's most. GiB assume "
        f"{spec.describe()}. Engines' clocks are compared as recorded."
    )


if __name__ == "__main__":
    render()
