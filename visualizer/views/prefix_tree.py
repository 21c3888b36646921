"""Prefix tree: the hottest block hashes chained by their parents; pick a block to see its
requests, first and last use, evictions and re-stores; the hottest prefixes' text when the
run recorded token ids and a tokenizer is on this machine, else their lengths."""

from __future__ import annotations

import os

import pandas as pd
import streamlit as st

from collector import token_text
from collector.model.family_names import text_snippet
from collector.model.nicknames import nickname, with_nicknames
from collector.model.time_window import TimeWindow
from collector.queries import prefix_tree
from collector.queries.config import recorded_tokenizer, run_config
from collector.store.run_file import RunFile
from visualizer.charts.prefix_tree import COLOR_BY, node_label, prefix_tree_figure
from visualizer.downloads import show_chart
from visualizer.metrics import metric_row
from visualizer.sidebar import controls
from visualizer.sidebar.time_filter import window_caption

CHART_KEY = "prefix_tree_chart"
NODE_KEY = "prefix_tree_node"
TOKENIZER_KEY = "prefix_tree_tokenizer"
TOKENIZER_RUN_KEY = "prefix_tree_tokenizer_run"
TREE_SIZES = (100, 300, 1_000, 3_000)
HOTTEST_PREFIXES = 5
HISTORY_ROWS = 500
PICKER_CHARACTERS = 48


def render() -> None:
    run, window = controls.render()
    block_size = int(run_config(run)["block_size"])
    st.title("Prefix tree")
    st.caption(
        f"Showing {window_caption(window, run)}. Each node is a cached block (or a run "
        "of them); its height is its hits, its children the blocks that followed it in some "
        "prompt. Click a node to zoom into it and see its history below."
    )
    first, second, third = st.columns(3)
    size = first.select_slider(
        "Blocks drawn (the most hit)", TREE_SIZES, value=1_000, key="prefix_tree_size"
    )
    color_by = second.radio("Colour by", COLOR_BY, horizontal=True, key="prefix_tree_colour")
    merge = third.toggle(
        "Merge unbranched runs",
        value=True,
        key="prefix_tree_merge",
        help="One node per run of blocks where each has one child with as many hits",
    )
    tokenizer = _tokenizer_input(run)
    blocks = with_nicknames(prefix_tree.tree_nodes(run, window, size), "tenant", "lora")
    if blocks.empty:
        st.info("No block was hit in this time range.")
        return
    drawn = prefix_tree.merge_unbranched(blocks) if merge else prefix_tree.single_blocks(blocks)
    # The tree holds every ancestor of its blocks: one read covers every text shown below.
    block_tokens = (
        prefix_tree.block_token_ids(run, blocks["block_hash"]) if tokenizer is not None else {}
    )
    texts = _node_texts(block_tokens, blocks, drawn, tokenizer)
    show_chart(
        prefix_tree_figure(
            drawn, color_by, block_size, texts, zoom_to=st.session_state.get(NODE_KEY)
        ),
        drawn,
        key=CHART_KEY,
        on_select=_clicked,
        selection_mode="points",
    )
    chosen = _node_picker(drawn, texts)
    if chosen:
        _node_details(run, window, drawn[drawn["block_hash"] == chosen].iloc[0], block_size)
    else:
        st.caption("Pick a block above, or click one in the tree, for its history.")
    _hottest_prefixes(block_tokens, blocks, drawn, block_size, tokenizer)


def _tokenizer_input(run: RunFile) -> token_text.TextTokenizer | None:
    """The tokenizer named in the input (first: $KVSCOPE_TOKENIZER, else the one the run
    names), if the run recorded token ids and that tokenizer is on this machine."""
    if st.session_state.get(TOKENIZER_RUN_KEY) != str(run.path):
        # Another run: start from the tokenizer it names, not the last run's.
        st.session_state[TOKENIZER_RUN_KEY] = str(run.path)
        st.session_state[TOKENIZER_KEY] = os.environ.get("KVSCOPE_TOKENIZER") or recorded_tokenizer(
            run_config(run)
        )
    name = st.text_input(
        "Tokenizer for the text (a tokenizer.json or SentencePiece model, a folder with one, "
        "package:path, or a model name already in the Hugging Face cache; nothing is "
        "downloaded)",
        key=TOKENIZER_KEY,
    )
    if not prefix_tree.has_token_ids(run):
        st.caption(
            "Positions, not text: the run did not record token ids (replay with "
            "--record-token-ids)."
        )
        return None
    tokenizer = _tokenizer(name)
    if tokenizer is None:
        st.caption("Positions, not text: no tokenizer is on this machine under that name.")
    return tokenizer


def _node_texts(
    block_tokens: dict[str, list[int]],
    blocks: pd.DataFrame,
    drawn: pd.DataFrame,
    tokenizer: token_text.TextTokenizer | None,
) -> list[str | None] | None:
    """Each drawn node's own text (its blocks, not the prefix above it)."""
    if tokenizer is None:
        return None
    spans = [
        prefix_tree.chain_to(blocks, block)[-count:]
        for block, count in zip(drawn["block_hash"], drawn["blocks"], strict=True)
    ]
    return [
        tokenizer.decode(ids) if ids else None
        for ids in prefix_tree.chain_token_ids(block_tokens, spans)
    ]


def _clicked() -> None:
    """A click on the tree picks that node in the select box."""
    points = st.session_state[CHART_KEY]["selection"]["points"]
    if points and points[0].get("id"):
        st.session_state[NODE_KEY] = points[0]["id"]


def _node_picker(drawn: pd.DataFrame, texts: list[str | None] | None) -> str:
    """The picked node (the tree zooms to it), one in the select box or the one clicked; ""
    for the whole tree."""
    texts = texts if texts is not None else [None] * len(drawn)
    labels = {"": "(the whole tree)"} | {
        block: f"{node_label(first, last)} · {hits:,} hits · {tenant or '(none)'} · "
        + (f"“{text_snippet(text, PICKER_CHARACTERS)}” · " if text else "")
        + block[:8]
        for block, first, last, hits, tenant, text in zip(
            drawn["block_hash"],
            drawn["first_position"],
            drawn["block_position"],
            drawn["hits"],
            drawn["tenant"].fillna("(none)"),
            texts,
            strict=True,
        )
    }
    if st.session_state.get(NODE_KEY) not in labels:
        st.session_state.pop(NODE_KEY, None)
    chosen = st.selectbox(
        "Block (or click one in the tree): the tree zooms to it",
        list(labels),
        format_func=lambda block: labels[block],
        key=NODE_KEY,
    )
    return str(chosen)


def _node_details(run: RunFile, window: TimeWindow, node: pd.Series, block_size: int) -> None:
    block = str(node["block_hash"])
    details = prefix_tree.node_details(run, int(block, 16), window, HISTORY_ROWS)
    summary = details.summary
    tenant, lora = (nickname(owner) if owner else None for owner in (summary.tenant, summary.lora))
    st.subheader(f"Block {block}")
    st.caption(
        f"{node_label(int(node['first_position']), int(node['block_position']))} of the "
        f"prompt ({(int(node['block_position']) + 1) * block_size:,} tokens of prefix up to "
        f"here); first stored by {summary.first_stored_by} (tenant "
        f"{tenant or '(none)'}, adapter {lora or '(none)'}); "
        f"cached {summary.cached_s:,.1f} s over the whole run."
    )
    metric_row(
        {
            "Hits": f"{summary.hits:,}",
            "Requests": f"{summary.requests:,}",
            "Times evicted": f"{summary.evictions:,}",
            "Times re-stored": f"{summary.restores:,}",
            "First use": _seconds(summary.first_use_s),
            "Last use": _seconds(summary.last_use_s),
        }
    )
    history = details.history
    st.dataframe(history, hide_index=True, key="prefix_tree_history")
    if len(history) == HISTORY_ROWS:
        st.caption(f"The first {HISTORY_ROWS} hits, stores and evictions in the range.")


def _seconds(value: float | None) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:,.1f} s"


def _hottest_prefixes(
    block_tokens: dict[str, list[int]],
    blocks: pd.DataFrame,
    drawn: pd.DataFrame,
    block_size: int,
    tokenizer: token_text.TextTokenizer | None,
) -> None:
    st.subheader("Hottest prefixes")
    tokens = (drawn["block_position"] + 1) * block_size
    hottest = drawn.assign(tokens=tokens, tokens_served=tokens * drawn["hits"]).nlargest(
        HOTTEST_PREFIXES, "tokens_served"
    )
    if tokenizer is None:
        st.dataframe(
            hottest[["block_hash", "first_position", "block_position", "tokens", "hits"]],
            hide_index=True,
            key="prefix_tree_hottest",
        )
        return
    chains = [prefix_tree.chain_to(blocks, block) for block in hottest["block_hash"]]
    prefixes = prefix_tree.chain_token_ids(block_tokens, chains)
    for block, position, hits, ids in zip(
        hottest["block_hash"], hottest["block_position"], hottest["hits"], prefixes, strict=True
    ):
        text = tokenizer.decode(ids) if ids else None
        title = f"{(position + 1) * block_size:,} tokens, {hits:,} hits (block {block[:8]})"
        if text:
            title += f": “{text_snippet(text, PICKER_CHARACTERS)}”"
        with st.expander(title):
            st.text(text or "(token ids missing)")


@st.cache_resource(max_entries=4)
def _tokenizer(name: str) -> token_text.TextTokenizer | None:
    return token_text.load_local_tokenizer(name)


if __name__ == "__main__":
    render()
