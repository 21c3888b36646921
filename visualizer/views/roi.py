"""ROI: what the prefix cache's hits saved, as prefill time per request (the TTFT a hit takes
off) and GPU-hours and dollars per day at the run's rate, over time, per tenant and per
prefix; every assumption editable."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from collector.charts.theme import on_wall_clock
from collector.model import cost
from collector.model.family_names import name_of
from collector.model.nicknames import with_nicknames
from collector.model.time_window import TimeWindow
from collector.queries import activity, roi, tenants
from collector.queries.config import run_config
from collector.queries.hotspots import hash_hex
from collector.store.run_file import RunFile
from visualizer import cost_inputs
from visualizer.charts import roi as roi_charts
from visualizer.charts.tenants import usage_label
from visualizer.downloads import show_chart
from visualizer.family_labels import named_families
from visualizer.metrics import metric_row
from visualizer.sidebar import controls
from visualizer.sidebar.time_filter import window_caption
from visualizer.wall_clock import chart_origin

TOP_PREFIXES = 15


def render() -> None:
    run, window = controls.render()
    block_size = int(run_config(run)["block_size"])
    st.title("Return on the prefix cache")
    st.caption(
        f"Showing {window_caption(window, run)}. Estimates, not measurements: a prompt's "
        "prefill time is its prefill FLOPs (2 x parameters x tokens, plus causal attention) "
        "run on the assumed GPU at the assumed MFU, the part of its TTFT the cache can take "
        "off (queueing and batching add to it); a hit saves the FLOPs of the tokens it covers."
    )
    model = cost_inputs.render()
    figures = activity.window_figures(run, window)
    prompts = cost.PromptTotals(
        figures["requests"],
        figures["prompt_tokens"],
        figures["prompt_tokens_squared"],
        figures["hit_tokens"],
        figures["hit_tokens_squared"],
    )
    totals = cost.roi_figures(
        model,
        prompts,
        block_seconds=roi.held_block_seconds(run, window),
        block_size=block_size,
        duration_s=window.duration_s,
    )
    _metrics(totals)
    st.caption(
        f"Per day at this window's rate: {figures['requests']:,} requests in "
        f"{window.duration_s:,.1f} s, {totals['requests_per_hour']:,.0f} an hour. "
        f"Cached blocks held {totals['mean_gb_held']:,.3g} GB of KV cache on average, "
        f"{totals['mean_gb_held'] / model.gpu_memory_gb:.1%} of the GPU's "
        f"{model.gpu_memory_gb:g} GB (vLLM allocates the KV cache up front: shown, not "
        "priced). "
        f"Assumed: {model.compute_assumptions()}; {model.memory_assumptions(block_size)}. "
        "Every chart below assumes the same."
    )
    _show_savings(run, window, model, block_size)


def _show_savings(run: RunFile, window: TimeWindow, model: cost.CostModel, block_size: int) -> None:
    """The savings over time, per tenant and adapter, and per prefix family."""
    points = activity.figures_over_time(run, window)
    if points.empty:
        st.info("Nothing happened in this time range.")
        return
    series = cost.savings_over_time(points, model, block_size)
    figure = on_wall_clock(roi_charts.savings_over_time_figure(series), chart_origin(run))
    show_chart(figure, series, key="roi_over_time")
    left, right = st.columns(2)
    with left:
        usage = with_nicknames(tenants.tenant_usage(run, window), "tenant", "lora")
        priced = cost.per_day(cost.price_prompts(usage, model, block_size), window.duration_s)
        priced = priced.assign(label=usage_label(usage))
        figure = roi_charts.saved_per_day_figure(priced, "label", "Per tenant and adapter")
        show_chart(figure, priced, key="roi_tenants")
    with right:
        prefixes = _labelled(run, roi.prefix_savings(run, window, TOP_PREFIXES))
        if prefixes.empty:
            st.info("No prefix was hit in this time range.")
            return
        priced = cost.per_day(cost.price_blocks(prefixes, model, block_size), window.duration_s)
        figure = roi_charts.saved_per_day_figure(priced, "label", "Per prefix family")
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


def _metrics(totals: dict[str, float]) -> None:
    uncached, cached = totals["prefill_ms_uncached"], totals["prefill_ms_cached"]
    cut = f"{cached - uncached:,.1f} ms ({(cached - uncached) / uncached:+.0%})" if uncached else ""
    metric_row(
        {
            "Prefill per request, uncached": f"{uncached:,.1f} ms",
            "With the prefix cache": f"{cached:,.1f} ms",
            "GPU-hours saved per day": f"{totals['gpu_hours_per_day']:,.3g}",
            "Saved per day (USD)": f"${totals['dollars_per_day']:,.2f} a day",
            "GPU-seconds saved": f"{totals['gpu_seconds_saved']:,.1f}",
        },
        {
            "Prefill per request, uncached": "The mean prefill time of the window's prompts "
            "with nothing cached: the TTFT floor without the prefix cache.",
            "With the prefix cache": "The mean prefill time of the same prompts less what "
            "their hits covered.",
            "GPU-hours saved per day": "GPU time the hits saved, at the window's request rate "
            "for 24 hours.",
            "Saved per day (USD)": "Those GPU-hours at the assumed $ per GPU-hour.",
            "GPU-seconds saved": "GPU time the hits saved in this window.",
        },
        falls={"With the prefix cache": cut} if cut else None,
    )


def _labelled(run: RunFile, prefixes: pd.DataFrame) -> pd.DataFrame:
    """Each family by its name (collector/model/family_names.py) and its hits; its first
    block's hash in hex for the download."""
    names = named_families(run, prefixes["root_hash"].tolist())
    labels = [
        f"{name_of(names, root)} ({hits:,} hits)"
        for root, hits in zip(prefixes["root_hash"], prefixes["block_hits"], strict=True)
    ]
    return with_nicknames(prefixes, "tenant").assign(
        root_hash=prefixes["root_hash"].map(hash_hex), label=labels
    )


if __name__ == "__main__":
    render()
