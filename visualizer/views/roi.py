"""ROI: compute the prefix cache's hits saved (GPU-seconds, money) against the memory its
cached blocks held, over time, per tenant and per prefix; every assumption editable."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from collector.model import cost
from collector.queries import activity, roi, tenants
from collector.queries.config import run_config
from collector.queries.hotspots import hash_hex
from visualizer import cost_inputs
from visualizer.charts import roi as roi_charts
from visualizer.charts.tenants import usage_label
from visualizer.downloads import show_chart
from visualizer.metrics import metric_row
from visualizer.sidebar import controls
from visualizer.sidebar.time_filter import window_caption

TOP_PREFIXES = 15


def render() -> None:
    run, window = controls.render()
    block_size = int(run_config(run)["block_size"])
    st.title("Return on the prefix cache")
    st.caption(
        f"Showing {window_caption(window, run)}. Estimates, not measurements: "
        "compute saved = prefill FLOPs of the hit tokens (2 x parameters x tokens, plus "
        "causal attention), run at the assumed MFU; memory = cached blocks x bytes per block, "
        "priced as its share of the GPU."
    )
    model = cost_inputs.render()
    compute_note = f"Assumed: {model.compute_assumptions()}."
    memory_note = f"Assumed: {model.memory_assumptions(block_size)}."
    figures = activity.window_figures(run, window)
    totals = cost.roi_figures(
        model,
        hit_tokens=figures["hit_tokens"],
        hit_tokens_squared=figures["hit_tokens_squared"],
        block_seconds=roi.held_block_seconds(run, window),
        block_size=block_size,
        duration_s=window.duration_s,
    )
    _metrics(totals, compute_note, memory_note)
    st.caption(f"{compute_note} {memory_note} Every chart below assumes the same.")
    points = activity.figures_over_time(run, window)
    if points.empty:
        st.info("Nothing happened in this time range.")
        return
    series = cost.savings_over_time(points, model, block_size)
    show_chart(roi_charts.savings_over_time_figure(series), series, key="roi_over_time")
    left, right = st.columns(2)
    with left:
        usage = tenants.tenant_usage(run, window)
        priced = cost.price_prompts(usage, model, block_size).assign(label=usage_label(usage))
        figure = roi_charts.saved_vs_held_figure(priced, "label", "Per tenant and adapter")
        show_chart(figure, priced, key="roi_tenants")
    with right:
        prefixes = _labelled(roi.prefix_savings(run, window, TOP_PREFIXES))
        if prefixes.empty:
            st.info("No prefix was hit in this time range.")
            return
        priced = cost.price_blocks(prefixes, model, block_size)
        figure = roi_charts.saved_vs_held_figure(priced, "label", "Per prefix family")
        show_chart(figure, priced, key="roi_prefixes")
        shown = (
            f"the {TOP_PREFIXES} most hit are shown"
            if len(prefixes) == TOP_PREFIXES
            else f"all {len(prefixes)} that were hit are shown"
        )
        st.caption(
            f"A prefix family is every block hash under one first block ({shown}); its "
            "savings count block hits, resumed preempted requests included."
        )


def _metrics(totals: dict[str, float], compute_note: str, memory_note: str) -> None:
    metric_row(
        {
            "GPU-seconds saved": f"{totals['gpu_seconds_saved']:,.1f}",
            "Compute saved": f"${totals['dollars_saved']:,.4g}",
            "Memory held (mean)": f"{totals['mean_gb_held']:,.3g} GB",
            "Memory cost": f"${totals['memory_dollars']:,.4g}",
            "Saved per $ of memory": f"{totals['return_ratio']:,.3g}x",
        },
        {
            "GPU-seconds saved": compute_note,
            "Compute saved": compute_note,
            "Memory held (mean)": memory_note,
            "Memory cost": memory_note,
        },
    )


def _labelled(prefixes: pd.DataFrame) -> pd.DataFrame:
    """Name each family by its first block, tenant and hits."""
    roots = prefixes["root_hash"].map(hash_hex)
    labels = [
        f"{root[:8]} ({tenant or '(none)'}, {hits:,} hits)"
        for root, tenant, hits in zip(
            roots, prefixes["tenant"].fillna("(none)"), prefixes["block_hits"], strict=True
        )
    ]
    return prefixes.assign(root_hash=roots, label=labels)


if __name__ == "__main__":
    render()
