"""Cache policies: at pool sizes around the run's own, how far vLLM's LRU is from Belady's MIN
(the ceiling), what pinning and admission would take of the gap, and, in plain words, whether
the traffic leaves a cache policy anything to win."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pandas as pd
import streamlit as st

from collector.advisor.context import RunContext
from collector.model.kv_memory import MODELS, KVSpec
from collector.model.policies import ReplayTooLarge
from collector.model.policy_curves import (
    ADMISSION_WINDOW,
    LOT_TO_WIN,
    NEAR_CEILING,
    PIN_FAMILIES,
    PolicyCurves,
    policy_curves,
    verdict,
)
from visualizer.charts.policies import POLICY_LINES, policy_curves_figure
from visualizer.downloads import show_chart
from visualizer.kv_spec_inputs import model_and_dtype
from visualizer.metrics import metric_row
from visualizer.run_source import current_run, open_run
from visualizer.sidebar import controls

COLUMNS = {
    "num_blocks": "pool (blocks)",
    "gib": "pool (GiB per GPU)",
    **{key: line[0] for key, line in POLICY_LINES.items()},
    "lru_share": "LRU's share of the ceiling",
}
VERDICT_BOXES = {"nothing": st.success, "some": st.info, "a lot": st.warning, "unknown": st.info}


@st.cache_data(max_entries=8, show_spinner="Replaying the cache policies ...")
def _curves(path: str, modified_ns: int) -> tuple[PolicyCurves | None, str]:
    """The run's policy curves, or None and why the replays were not run."""
    del modified_ns  # part of the cache key: a rewritten run is replayed afresh
    context = RunContext(open_run(Path(path)), Path(path))
    if context.num_engines > 1:
        return None, (
            f"this run has {context.num_engines} engines, each with its own pool, and the "
            "policy replays model one pool (replay one engine's share of the trace to compare "
            "policies)"
        )
    try:
        curves = policy_curves(context.block_stream, context.block_size, context.num_blocks)
    except ReplayTooLarge as error:
        return None, str(error)
    return curves, ""


def _spec() -> KVSpec:
    """The model KV spec the GiB column assumes; the user can change it."""
    with st.expander("Assumption: model KV spec (for the GiB column)", expanded=False):
        first, second = st.columns(2)
        model, dtype = model_and_dtype(first, second, "policies")
    return KVSpec(**{**asdict(MODELS[model]), "dtype": dtype})


def render() -> None:
    controls.render()
    path = current_run()
    st.title("Cache policies")
    spec = _spec()
    curves, refused = _curves(str(path), path.stat().st_mtime_ns)
    if curves is None:
        st.info(f"No policy replays for this run: {refused}.")
        return
    found = verdict(curves)
    VERDICT_BOXES[found.room](found.text)
    point = curves.at(curves.run_num_blocks)
    if point is not None:
        metric_row(
            {
                "LRU (vLLM) at this pool": f"{point.lru.token_hit_ratio:.1%}",
                "Ceiling (Belady's MIN)": f"{point.ceiling.token_hit_ratio:.1%}",
                "Left to win": f"{point.gap * 100:.1f} points",
            }
        )
    st.caption(
        f"{path.name}: block size {curves.block_size}, {curves.run_num_blocks:,} blocks. Each "
        "policy replays the run's recorded block hashes one request at a time, so LRU here "
        "can differ a little from the hit ratio the run recorded with requests in flight "
        "together. The replays cover the whole run (the time filter does not apply here); "
        f"GiB assume {spec.describe()}."
    )
    if curves.skipped_sizes:
        st.caption(f"Not shown: {curves.skipped_reason()}.")
    rows = curves.rows(spec)
    show_chart(
        policy_curves_figure(rows, curves.run_num_blocks),
        pd.DataFrame(rows),
        key="policies_curves",
    )
    table = pd.DataFrame(rows)[list(COLUMNS)].rename(columns=COLUMNS)
    percent = st.column_config.NumberColumn(format="percent")
    st.dataframe(
        table,
        hide_index=True,
        key="policies_table",
        column_config={
            COLUMNS["num_blocks"]: st.column_config.NumberColumn(format="localized"),
            COLUMNS["gib"]: st.column_config.NumberColumn(format="%.2f"),
            **{COLUMNS[key]: percent for key in (*POLICY_LINES, "lru_share")},
        },
    )
    _explanations(curves)


def _explanations(curves: PolicyCurves) -> None:
    st.subheader("The policies")
    st.markdown(
        "- **LRU (vLLM)**: vLLM's own. A freed block stays cached at the tail of the free "
        "queue; a new block takes the head, evicting the least recently used cached block.\n"
        f"- **LRU + pinning**: the {curves.pinned_families:,} hottest prefix families (of "
        f"{PIN_FAMILIES} looked for; the most reuses) never leave the cache once stored: up "
        "to half the pool, and never the room the largest request needs.\n"
        f"- **LRU + admission**: prefix families that no request reuses within "
        f"{ADMISSION_WINDOW} requests are not cached: their blocks go back empty and evict "
        f"nothing ({_one_offs(curves.one_off_families)}).\n"
        "- **Belady's MIN, the ceiling**: evicts the block whose next hit lies furthest "
        "ahead. It needs the future, so no real cache runs it, but no policy that keeps "
        "prefixes (as vLLM's prefix rule needs) hits more at that pool size: the gap "
        "between LRU and it is all a cache policy could ever win there."
    )
    st.markdown(
        f"**Reading the verdict**: LRU at {NEAR_CEILING:.0%} or more of the ceiling's hits "
        "leaves nothing to win; a gap of "
        f"{LOT_TO_WIN * 100:.0f} points of token hit ratio or more is a lot."
    )
    st.subheader("What an operator can do")
    st.markdown(
        "vLLM has no pinning or admission flag today. To the same end: keep the hot "
        "families warm (a one-token request with their prefix while the engine is idle), "
        "route them to replicas of their own so one-off traffic does not evict them, or add "
        "a CPU tier (`--kv-offloading-size`) that catches what the GPU pool evicts. A larger "
        "pool moves LRU along its line in the chart above."
    )


def _one_offs(count: int) -> str:
    if count == 0:
        return "none here: every family comes back in time, so admission caches what LRU does"
    return f"{count:,} {'family' if count == 1 else 'families'} here"


if __name__ == "__main__":
    render()
