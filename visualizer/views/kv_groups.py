"""KV cache groups: for a hybrid model (sliding-window, chunked-local or Mamba layers beside full
attention), what each group stored, reused and lost, and how much of the shared pool it held."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from collector.charts.theme import on_wall_clock
from collector.model.time_window import TimeWindow
from collector.queries import kv_groups
from collector.queries.config import run_config
from collector.store.run_file import RunFile
from visualizer.charts.kv_groups import group_in_use_figure
from visualizer.downloads import show_chart
from visualizer.metrics import metric_row
from visualizer.sidebar import controls
from visualizer.sidebar.time_filter import window_caption
from visualizer.wall_clock import chart_origin

COLUMNS = {
    "kv_group": "group",
    "kind": "attention",
    "allocated": "blocks allocated",
    "stored": "blocks stored",
    "block_hits": "block hits",
    "evicted": "blocks evicted",
    "peak_in_use": "most blocks held",
    "mean_hit_start": "hits start at block (mean)",
}


def render() -> None:
    run, window = controls.render()
    groups = kv_groups.layout(run)
    figures = kv_groups.group_figures(run, window)
    st.title("KV cache groups")
    st.caption(
        f"Showing {window_caption(window, run)}. vLLM gives each attention kind of a model its "
        "own KV cache groups, all drawing blocks from one pool; every request holds blocks in "
        "every group. A prefix hit is the longest prefix every group can serve: a "
        "sliding-window group keeps, and reuses, only the blocks its window still reads; a "
        "Mamba group one state block where a prefix ends."
    )
    if len(groups) == 1 and groups[0].kind == "full":
        st.info(
            "This run has one full-attention group, so every block figure on the other pages "
            "is that group's. A hybrid model (gpt-oss, Gemma 3, Llama 4) has several: capture "
            "one live, or replay a trace as one with `kvscope replay --kv-layout gpt-oss` "
            "(or `gemma3`, `llama4`, or groups spelled out)."
        )
    _metrics(run, window, figures)
    st.dataframe(
        figures[list(COLUMNS)].rename(columns=COLUMNS),
        hide_index=True,
        key="kv_groups_table",
        column_config={COLUMNS["mean_hit_start"]: st.column_config.NumberColumn(format="%.1f")},
    )
    timeline = kv_groups.in_use_timeline(run, window)
    if timeline.empty:
        return
    usable = int(run_config(run)["num_blocks"]) - 1
    show_chart(
        on_wall_clock(
            group_in_use_figure(timeline, list(figures["kind"]), usable), chart_origin(run)
        ),
        timeline,
        key="kv_groups_in_use",
    )
    st.caption(
        "Blocks each group held after each scheduler step, counted by the collector from the "
        "stream (their sum is vLLM's own in-use count). A sliding-window group frees the "
        "blocks that fall out of its window while its request still runs."
    )


def _metrics(run: RunFile, window: TimeWindow, figures: pd.DataFrame) -> None:
    """Which group holds the most, how much of the reuse is full attention's, and the hits a
    group cut short."""
    busiest = int(figures["peak_in_use"].fillna(0).to_numpy().argmax())
    total_hits = int(figures["block_hits"].sum())
    full_hits = int(figures.loc[figures["kind"] == "full attention", "block_hits"].sum())
    cut = kv_groups.cut_short(run, window)
    cut_share = cut["tokens"] / (cut["tokens"] + cut["hit_tokens"]) if cut["tokens"] else 0.0
    metric_row(
        {
            "Holds the most blocks": f"group {busiest}",
            "Block hits in full attention": f"{full_hits / total_hits:.0%}" if total_hits else "-",
            "Hits cut short by a group": f"{cut['requests']:,}",
            "Tokens they lost": f"{cut['tokens']:,} ({cut_share:.0%})",
        },
        {
            "Holds the most blocks": "The group whose blocks in use peaked highest: the one "
            "that runs the shared pool out first.",
            "Block hits in full attention": "Of all block reuses, those of full-attention "
            "groups; a window group reuses only its window's blocks.",
            "Hits cut short by a group": "Requests whose prefix one group had cached further "
            "than every group could serve (vLLM reuses only the prefix all groups hold): "
            "typically full attention held it, and a sliding window had lost the blocks at "
            "the end of it.",
            "Tokens they lost": "The tokens between the hit and the longest prefix one group "
            "held, computed again; in brackets, of those plus every hit token.",
        },
    )


if __name__ == "__main__":
    render()
