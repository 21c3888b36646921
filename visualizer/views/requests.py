"""Requests: find a request by its id, its tenant or words of its prompt, and see why its
prompt missed: its lookups (its first admission, and each after a preemption), and per block
position hit or missed, the cause in words and its details (evicted by which request and
tenant, how long before; which key; which engine; why unexplained), with the prompt's text
where the run recorded token ids."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from collector.model.nicknames import nickname, nicknames
from collector.queries import request_search
from collector.queries.config import run_config
from collector.queries.latency import request_times_ms
from collector.queries.miss_causes import CAUSE_NAMES, CAUSES, lookup_causes, request_block_causes
from collector.queries.timeline import time_grid
from collector.safe_text import markdown_text
from collector.store.run_file import RunFile
from collector.token_text import TextTokenizer
from visualizer import request_blocks
from visualizer.charts.miss_causes import block_strip_figure
from visualizer.downloads import show_chart
from visualizer.metrics import metric_row
from visualizer.run_tokenizer import run_tokenizer
from visualizer.sidebar import controls

SEARCH_KEY = "requests_search"
PICK_KEY = "requests_pick"
MATCHES_SHOWN = 200
MISSED_CAUSES = [cause for cause in CAUSES if cause not in ("hit", "tier")]


def render() -> None:
    run, _window = controls.render()
    st.title("Requests")
    st.caption(
        "Find a request by its id, its tenant or words of its prompt (the whole run is "
        "searched, whatever the time range), and see why its prompt missed the cache."
    )
    tokenizer = run_tokenizer(run)
    text = st.text_input(
        "Request id, tenant or prompt words",
        key=SEARCH_KEY,
        placeholder="rag-15, acme, customer assistant ...",
        help="Prompt words are found where the run recorded token ids and its tokenizer is "
        "on this machine; a whole word or phrase, not a piece of a word",
    )
    found = _find(run, text, tokenizer)
    if found.empty:
        st.info(f"No request's id, tenant or prompt holds “{text.strip()}”.")
        return
    request = _picker(run, found, f"{PICK_KEY}:{text.strip()}")
    _show(run, request, tokenizer)


def _find(run: RunFile, text: str, tokenizer: TextTokenizer | None) -> pd.DataFrame:
    """The requests that match `text`: every request (the first to arrive) when it is empty."""
    needle = text.strip().lower()
    names = nicknames(request_search.run_tenants(run))
    tenants = [
        label
        for label, name in names.items()
        if needle and (needle in name.lower() or needle in label.lower())
    ]
    prompts = [tokenizer.encode(text.strip())] if tokenizer is not None and needle else []
    return request_search.find_requests(run, text, tenants, prompts, MATCHES_SHOWN)


def _picker(run: RunFile, found: pd.DataFrame, key: str) -> str:
    """The request picked among those found: a select box of its own for each search (so a
    new search starts from its first match, in the browser too)."""
    origin = time_grid(run).start_ns
    labels = {
        str(row["request_id"]): f"{row['request_id']} · "
        f"{nickname(row['tenant']) if isinstance(row['tenant'], str) else 'no tenant'} · "
        f"at {(row['arrival_ns'] - origin) / 1e9:,.1f} s · "
        f"{int(row['num_prompt_tokens']):,} prompt tokens · matched on {row['matched']}"
        for row in found.to_dict("records")
    }
    if st.session_state.get(key) not in labels:
        st.session_state.pop(key, None)
    more = f" (the first {MATCHES_SHOWN})" if len(found) == MATCHES_SHOWN else ""
    matching = "1 request matches" if len(found) == 1 else f"{len(found):,} requests match"
    picked = st.selectbox(
        f"{matching}{more}",
        list(labels),
        format_func=labels.__getitem__,
        key=key,
    )
    return str(picked)


def _show(run: RunFile, request: str, tokenizer: TextTokenizer | None) -> None:
    row = request_search.request_row(run, request)
    causes = lookup_causes(run, request)
    st.subheader(f"Request {markdown_text(request)}")
    if row is not None:
        st.caption(_described(run, row))
    if causes.empty:
        st.info("No lookup of this request was recorded: it was never scheduled.")
        return
    causes, blocks = request_blocks.numbered(causes, request_block_causes(run, request))
    tenants = request_search.request_tenants(run, blocks["evicted_by"].dropna().tolist())
    block_size = int(run_config(run)["block_size"])
    segments = request_blocks.segments(causes, blocks, block_size, tenants)
    _verdict(causes)
    lookups = _lookup_table(causes, request_blocks.lookup_names(causes))
    st.dataframe(lookups, hide_index=True, key="requests_lookups")
    show_chart(block_strip_figure(segments), segments, key="requests_blocks")
    st.subheader("Block by block")
    runs = request_blocks.merged(segments, block_size)
    table = runs.assign(cause=[CAUSE_NAMES[cause] for cause in runs["cause"]])
    prompt = request_search.prompt_token_ids(run, request) if tokenizer is not None else None
    if tokenizer is not None and prompt is not None:
        table = table.assign(text=_texts(tokenizer, prompt, runs))
    shown = ["lookup", "where", "cause", "detail", "tokens", "text"]
    columns = [column for column in shown if column in table.columns]
    st.dataframe(
        table[columns],
        hide_index=True,
        key="requests_table",
        column_config={"detail": st.column_config.TextColumn(width="large")},
    )
    if tokenizer is not None and prompt is not None:
        with st.expander("The prompt's text"):
            st.text(tokenizer.decode(prompt))
    else:
        st.caption(
            "Positions, not text: the run did not record token ids, or its tokenizer is "
            "not on this machine."
        )


def _described(run: RunFile, row: dict[str, Any]) -> str:
    origin = time_grid(run).start_ns
    tenant = nickname(row["tenant"]) if isinstance(row["tenant"], str) else "none"
    lora = nickname(row["lora"]) if isinstance(row["lora"], str) else "none"
    salted = "salted" if isinstance(row["salt_hash"], str) else "no cache salt"
    queue_ms, ttft_ms = request_times_ms(row)
    timing = ""
    if queue_ms is not None and ttft_ms is not None:
        clock = "measured" if run_config(run)["source"] == "engine" else "modelled"
        timing = (
            f" Queued {queue_ms:,.1f} ms, first token after {ttft_ms:,.1f} ms ({clock}, "
            f"{row['num_prefill_tokens']:,} prompt tokens computed)."
        )
    return (
        f"Tenant {markdown_text(tenant)}, adapter {markdown_text(lora)}, {salted}; arrived at "
        f"{(row['arrival_ns'] - origin) / 1e9:,.2f} s; {row['num_prompt_tokens']:,} prompt "
        f"tokens, {_count(row['num_preemptions'] or 0, 'preemption')}.{timing}"
    )


def _verdict(causes: pd.DataFrame) -> None:
    """The request's tokens in one row of figures, and whether anything missed that the
    cache could have served (every lookup ends on a partial block vLLM always computes)."""
    tokens = causes.groupby("cause")["tokens"].sum()
    looked_up = int(tokens.sum())
    missed = {cause: int(tokens.get(cause, 0)) for cause in MISSED_CAUSES}
    avoidable = sum(count for cause, count in missed.items() if cause != "partial_block")
    metric_row(
        {
            "Prompt tokens looked up": f"{looked_up:,}",
            "Hit": f"{int(tokens.get('hit', 0)):,}",
            "Missed": f"{sum(missed.values()):,}",
        },
        {"Prompt tokens looked up": "over its lookups: a resumed request looks up again"},
    )
    if not avoidable:
        st.success(
            "No misses: every full block of the prompt was served from the cache; only its "
            f"last {missed['partial_block']:,} tokens were computed (the partial block vLLM "
            "always computes)."
        )
        return
    worst = max((cause for cause in missed if cause != "partial_block"), key=missed.__getitem__)
    st.markdown(
        f"**{avoidable:,} tokens missed** that a cache could have served; the biggest cause: "
        f"{CAUSE_NAMES[worst]} ({missed[worst]:,} tokens)."
    )


def _lookup_table(causes: pd.DataFrame, names: dict[int, str]) -> pd.DataFrame:
    """One row per lookup: when, and its tokens per cause (the causes it had, in words)."""
    origin = int(causes["ts_ns"].min())
    table = causes.pivot_table(index="seq", columns="cause", values="tokens", aggfunc="sum")
    table = table.reindex(columns=[cause for cause in CAUSES if cause in table.columns])
    times = causes.drop_duplicates("seq").set_index("seq")["ts_ns"]
    table.insert(0, "after the first (s)", (times - origin) / 1e9)
    if causes["engine"].astype(bool).any() or causes["rank"].any():  # a fleet's: which engine
        engines = causes.drop_duplicates("seq").set_index("seq")
        table.insert(0, "engine", engines["engine"] + " rank " + engines["rank"].astype(str))
    table.insert(0, "lookup", [names[int(seq)] for seq in table.index])
    renamed = table.rename(columns=CAUSE_NAMES).fillna(0)
    return renamed.astype({CAUSE_NAMES[c]: int for c in CAUSES if CAUSE_NAMES[c] in renamed})


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}" + ("" if number == 1 else "s")


def _texts(tokenizer: TextTokenizer, prompt: list[int], segments: pd.DataFrame) -> list[str]:
    """Each segment's own text, from the prompt's token ids."""
    return [
        tokenizer.decode(prompt[start : start + tokens])
        for start, tokens in zip(segments["start"], segments["tokens"], strict=True)
    ]


if __name__ == "__main__":
    render()
