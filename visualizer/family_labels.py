"""Prefix families named by what they hold, for the pages that rank them by what they lost:
the start of the first block's text where the run recorded token ids (and its tokenizer is
on this machine), else the tenant that first stored it; the adapter after it. The hash stays
in hovers and downloads, never as the name."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from collector.model.nicknames import nickname
from collector.token_text import TextTokenizer
from visualizer.charts.prefix_tree import text_snippet

NO_FAMILY = "(no block stored or hit)"


def family_labels(
    roots: pd.DataFrame, tokenizer: TextTokenizer | None, characters: int = 44
) -> dict[int, str]:
    """Each family of `roots` (`collector.queries.request_search.family_roots`) by name.
    Families whose names would be the same are numbered apart (#1, #2, ...)."""
    names = {}
    for family, tenant, lora, ids in zip(
        roots["family"], roots["tenant"], roots["lora"], roots["token_ids"], strict=True
    ):
        text = tokenizer.decode(list(ids)) if tokenizer is not None and ids is not None else ""
        owner = nickname(tenant) if isinstance(tenant, str) else "no tenant"
        name = f"“{text_snippet(text, characters)}”" if text.strip() else f"{owner}'s prompts"
        adapter = f" (adapter {nickname(lora)})" if isinstance(lora, str) else ""
        names[int(family)] = name + adapter
    counts = Counter(names.values())
    numbered: Counter[str] = Counter()
    labels = {}
    for family, name in names.items():
        numbered[name] += 1
        labels[family] = name if counts[name] == 1 else f"{name} #{numbered[name]}"
    return labels


def label_of(labels: dict[int, str], family: object) -> str:
    """A family's label (NO_FAMILY for a lookup that stored and hit no block)."""
    if family is None or pd.isna(family):  # type: ignore[call-overload]
        return NO_FAMILY
    return labels.get(int(family), "(family not found)")  # type: ignore[call-overload]
