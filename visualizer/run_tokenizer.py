"""The tokenizer that turns a run's recorded token ids into text on the pages that show
prompts: $KVSCOPE_TOKENIZER, else the one the run names; None where the run recorded no
token ids or that tokenizer is not on this machine (nothing is downloaded)."""

from __future__ import annotations

import os

import streamlit as st

from collector import token_text
from collector.queries.config import recorded_tokenizer, run_config
from collector.queries.prefix_tree import has_token_ids
from collector.store.run_file import RunFile


def run_tokenizer(run: RunFile) -> token_text.TextTokenizer | None:
    """The run's tokenizer, if it recorded token ids and the tokenizer is here."""
    if not has_token_ids(run):
        return None
    name = os.environ.get("KVSCOPE_TOKENIZER") or recorded_tokenizer(run_config(run))
    return _loaded(name)


@st.cache_resource(max_entries=4)
def _loaded(name: str) -> token_text.TextTokenizer | None:
    return token_text.load_local_tokenizer(name)
