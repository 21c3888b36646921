"""The Overview's latency section: time to first token and queue time by how much of each
prompt the cache held, measured on a live capture and modelled on a replay."""

from __future__ import annotations

import streamlit as st

from collector.queries.latency import latency_sentence, request_latency
from collector.store.run_file import RunFile
from visualizer.charts.latency import latency_by_hit_share_figure
from visualizer.downloads import show_chart
from visualizer.glossary import TERMS

NO_FIRST_TOKENS = (
    "Latency by hit share: this run has no first-token records (captured by a kvscope from "
    "before them, a replay that does not run vLLM's scheduler, or vLLM's KV events alone)."
)
MODELLED = (
    "The replay's clock: each step as long as its step model says (a fixed cost plus one "
    "per token computed), each first token at the end of its step. A live capture measures "
    "the engine's own."
)


def render(run: RunFile) -> None:
    """One sentence, the percentiles chart and its table (the whole run)."""
    latency = request_latency(run)
    if latency.empty:
        st.caption(NO_FIRST_TOKENS)
        return
    st.subheader(
        f"Latency by hit share ({latency.clock})",
        help=f"{TERMS['TTFT']} {TERMS['queue time']} {TERMS['hit share']}",
    )
    st.markdown(latency_sentence(latency))
    if latency.clock == "modelled":
        st.caption(MODELLED)
    table = latency.by_hit_share
    figure = latency_by_hit_share_figure(table, latency.clock)
    show_chart(figure, latency.requests, key="overview_latency")
