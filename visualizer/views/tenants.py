"""Tenants & adapters: hits and savings per tenant and LoRA adapter, the cache each holds,
and cross-tenant sharing (a timing side channel when tenants are not salted apart)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from collector.model import cost
from collector.model.nicknames import with_nicknames
from collector.queries import tenants
from collector.queries.config import run_config
from visualizer.charts import tenants as tenant_charts
from visualizer.cost_inputs import current_cost_model
from visualizer.downloads import show_chart
from visualizer.sidebar import controls
from visualizer.sidebar.time_filter import window_caption


def render() -> None:
    run, window = controls.render()
    block_size = int(run_config(run)["block_size"])
    model = current_cost_model()
    usage = with_nicknames(tenants.tenant_usage(run, window), "tenant", "lora")
    usage = cost.price_prompts(usage, model, block_size)
    st.title("Tenants & adapters")
    st.caption(f"Showing {window_caption(window, run)}.")
    if usage.empty:
        st.info("No request in this time range.")
        return
    left, right = st.columns(2)
    with left:
        show_chart(tenant_charts.tenant_tokens_figure(usage), usage, key="tenants_tokens")
    with right:
        show_chart(tenant_charts.blocks_held_figure(usage), usage, key="tenants_blocks")
    st.dataframe(_usage_table(usage), hide_index=True, key="tenants_table")
    st.caption(
        f"Savings assumed: {model.compute_assumptions()} (edit them on the ROI page). "
        "Blocks are counted for the tenant and adapter of the request that stored them."
    )
    cross = with_nicknames(tenants.cross_tenant_hits(run, window), "stored_tenant", "hit_tenant")
    st.subheader("Cross-tenant sharing")
    if cross.empty:
        st.info("No block hit in this time range.")
        return
    show_chart(tenant_charts.sharing_figure(cross), cross, key="tenants_sharing")
    _side_channels(cross, usage)


def _usage_table(usage: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "tenant": usage["tenant"],
            "adapter": usage["lora"],
            "requests": usage["requests"],
            "hit ratio": usage["hit_ratio"].map("{:.1%}".format),
            "tokens saved": usage["hit_tokens"],
            "GPU-seconds saved": usage["gpu_seconds_saved"].round(2),
            "USD saved in this window": usage["dollars_saved"].round(4),
            "salted requests": usage["salted_requests"],
            "blocks stored": usage["blocks_stored"],
            "blocks held (mean)": usage["mean_blocks_held"].round(1),
        }
    )


def _side_channels(cross: pd.DataFrame, usage: pd.DataFrame) -> None:
    shared = cross[cross["cross_tenant"]]
    if shared.empty:
        st.success("No block stored by one tenant was hit by another tenant in this range.")
    else:
        reasons = [
            "stored without a cache salt" if unsalted else "the tenants share a cache salt"
            for unsalted in shared["unsalted_hits"] > 0
        ]
        st.warning(
            "Timing side channel: these tenants were served blocks another tenant stored, so "
            "each can tell from its time to first token what the other sent. Give each "
            "tenant its own cache_salt to separate them."
        )
        st.dataframe(
            shared.assign(why=reasons).drop(columns="cross_tenant"),
            hide_index=True,
            key="tenants_cross_table",
        )
    unsalted = sorted(set(usage.loc[usage["salted_requests"] < usage["requests"], "tenant"]))
    if len(unsalted) > 1:
        st.caption(
            f"Not salted: {', '.join(unsalted)}. Any prefix they share would be served "
            "across tenants."
        )


if __name__ == "__main__":
    render()
