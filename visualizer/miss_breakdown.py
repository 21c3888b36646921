"""The Overview's lead: why the window's prompts missed. One sentence of verdict, the
waterfall of the prompt tokens (hit, then each cause of a miss), why the unexplained tokens
could not be told, and the prefix families that lost the most tokens, and to what."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from collector.model.family_names import name_of
from collector.model.time_window import TimeWindow
from collector.queries.hotspots import hash_hex
from collector.queries.miss_causes import (
    CAUSE_NAMES,
    UNEXPLAINED_REASONS,
    cause_totals,
    family_losses,
    lookup_causes,
)
from collector.safe_text import code
from collector.store.run_file import RunFile
from visualizer.charts import miss_causes as charts
from visualizer.downloads import show_chart
from visualizer.family_labels import named_families
from visualizer.pages import PAGES

TOP_FAMILIES = 8
SERVED = ("hit", "tier")
NO_LOOKUPS = (
    "Why prompts missed: this run has no lookups (a run of vLLM's KV events alone carries "
    "no requests), so its misses have no causes to show."
)


def verdict(totals: pd.DataFrame) -> str:
    """One sentence: the share of the prompt tokens served, and the biggest loss."""
    share = dict(zip(totals["cause"], totals["share"], strict=True))
    tokens = dict(zip(totals["cause"], totals["tokens"], strict=True))
    served = f"{share['hit']:.1%} of prompt tokens were served from the cache"
    if tokens["tier"]:
        served += f" and {share['tier']:.1%} loaded from the offload tier"
    lost = totals[~totals["cause"].isin(SERVED) & (totals["tokens"] > 0)]
    if lost.empty:
        return served + "; none missed."
    cause = str(lost.sort_values("tokens", ascending=False, kind="stable")["cause"].iloc[0])
    return (
        f"{served}; the biggest loss is {CAUSE_NAMES[cause]}: "
        f"{share[cause]:.1%} ({int(tokens[cause]):,} tokens)."
    )


def unexplained_line(rows: pd.DataFrame, looked_up: int) -> str | None:
    """Why the unexplained tokens of `lookup_causes` rows could not be told (None: none)."""
    unexplained = rows[rows["cause"] == "unexplained"]
    if unexplained.empty:
        return None
    reasons = unexplained.groupby("reason", dropna=False)["tokens"].sum().sort_values()[::-1]
    said = "; ".join(
        f"{int(tokens):,} tokens: {UNEXPLAINED_REASONS.get(str(reason), 'no reason recorded')}"
        for reason, tokens in reasons.items()
    )
    share = int(unexplained["tokens"].sum()) / looked_up
    return f"Unexplained, {share:.1%} of the prompt tokens ({said})."


def render(run: RunFile, window: TimeWindow) -> None:
    """The section, at the top of the Overview."""
    totals = cause_totals(run, window)
    looked_up = int(totals["tokens"].sum())
    if not looked_up:
        whole_run = int(cause_totals(run)["tokens"].sum())
        st.caption(NO_LOOKUPS if not whole_run else "No lookup in this time range.")
        return
    st.subheader(verdict(totals))
    rows = lookup_causes(run, window=window)
    line = unexplained_line(rows, looked_up)
    if line:
        st.caption(line)
    left, right = st.columns(2)
    with left:
        show_chart(charts.waterfall_figure(totals), totals, key="overview_miss_causes")
    with right:
        losses = named_losses(run, family_losses(run, window))
        if losses.empty:
            st.caption("No prefix family missed a token in this time range.")
        else:
            figure = charts.family_losses_figure(losses)
            show_chart(figure, losses, key="overview_family_losses")
            if not losses["label"].str.startswith(("“", "(")).all():  # not all named by text
                command = code(f"kvscope names {run.path} --family KEY=NAME")
                st.caption(
                    f"A family with no prompt text is named by its tenant and first request "
                    f"until you name it: {command}, KEY its label, a request of it or the hash "
                    "in its hover."
                )
    diverged = int(totals.loc[totals["cause"] == "diverged", "tokens"].sum())
    if diverged:
        words, link = st.columns([5, 1], vertical_alignment="center")
        words.caption(
            f"Diverged prefixes ({diverged:,} tokens) often come from a field that changes in "
            "every prompt (a time, a request id): the Advisor's dynamic-field rule names it "
            "and says where to move it."
        )
        (advisor,) = (page for page in PAGES if page.file == "advisor.py")
        link.page_link(advisor.path, label=advisor.title, icon=":material/arrow_forward:")
    st.caption(
        "Every lookup counts: a request's first admission, and each after a preemption "
        f"({rows.loc[rows['preempted'], 'seq'].nunique():,} here), which looks its prompt up "
        "again. The Requests page shows one request's causes, block by block."
    )


def named_losses(run: RunFile, losses: pd.DataFrame, top: int = TOP_FAMILIES) -> pd.DataFrame:
    """The `top` families of `family_losses` that lost most, each with its `label` (the
    start of its text, or its tenant) and its first block's hash (`family_hex`)."""
    kept = losses.drop_duplicates("family")["family"].head(top)
    missing = bool(kept.isna().any())
    losses = losses[losses["family"].isin(kept) | (losses["family"].isna() & missing)]
    labels = named_families(run, [int(family) for family in kept.dropna()])
    return losses.assign(
        label=[name_of(labels, family) for family in losses["family"]],
        family_hex=[hash_hex(family) for family in losses["family"]],
    )
