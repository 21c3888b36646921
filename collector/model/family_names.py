"""A prefix family's name wherever one is shown (every page of the app, `kvscope explain`),
by one rule, in this order: the first words of its first block's text where the run recorded
token ids (and a tokenizer is here to read them); else the name a user gave it (`kvscope
names RUN --family KEY=NAME`, collector/store/given_names.py); else the tenant that first
stored that block and the request that stored it. Its adapter follows. The hash is never the
name: it stays in hovers and downloads."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import pandas as pd

from collector.model.nicknames import nickname

CHARACTERS = 44  # a name's text, cut with an ellipsis
NO_FAMILY = "(no block stored or hit)"
LONGEST_NAME = 60  # characters of a name a user gives
# A name that reads as a hash (hex digits, the way block hashes are shown) would be one.
_HASH_LIKE = re.compile(r"^(0x)?[0-9a-f]{8,}\b", re.IGNORECASE)
_MARKUP = "<>"  # Plotly draws tags in a chart's labels


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a family (empty, too long, a control character, markup, read as
    a hash), in words; None when it can."""
    if not name.strip():
        return "the name is empty"
    if len(name) > LONGEST_NAME:
        return f"the name is {len(name)} characters, more than {LONGEST_NAME}"
    if not name.isprintable():
        return "the name holds a control or unprintable character"
    if any(mark in name for mark in _MARKUP):
        return "the name holds < or >, which charts would read as markup"
    if _HASH_LIKE.match(name.strip()):
        return "the name reads as a hash; a family is named so that it is not one"
    return None


def text_snippet(text: str, length: int) -> str:
    """The text on one line, cut to `length` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= length else flat[: length - 1].rstrip() + "…"


def family_name(
    text: str | None,
    tenant: Any,
    first_request: Any,
    adapter: Any = None,
    characters: int = CHARACTERS,
    *,
    given: Any = None,
) -> str:
    """One family's name: “its first words” where `text` has any, else the name a user
    `given` it, else its first storer's `tenant` (nicknamed) and the `first_request` that
    stored it; then its `adapter`."""
    owner = nickname(tenant) if isinstance(tenant, str) and tenant else "no tenant"
    if text is not None and text.strip():
        name = f"“{text_snippet(text, characters)}”"
    elif isinstance(given, str) and name_problem(given) is None:
        name = " ".join(given.split())
    elif isinstance(first_request, str) and first_request:
        name = f"{owner} · request {text_snippet(first_request, 24)}"
    else:
        name = f"{owner}'s prompts"
    return name + (f" (adapter {nickname(adapter)})" if isinstance(adapter, str) else "")


def family_names(
    roots: pd.DataFrame,
    decode: Callable[[list[int]], str] | None,
    characters: int = CHARACTERS,
) -> dict[int, str]:
    """Each family of `roots` (`collector.queries.request_search.family_roots`: family,
    tenant, lora, first_request, token_ids, given_name where a user gave one; `decode`: token
    ids to text, None where no tokenizer is here) by name; families whose names would be the same
    are numbered apart (#1, #2, ...)."""
    names = {}
    for row in roots.to_dict("records"):
        ids = row["token_ids"]
        text = decode(list(ids)) if decode is not None and ids is not None else None
        names[int(row["family"])] = family_name(
            text,
            row["tenant"],
            row["first_request"],
            row["lora"],
            characters,
            given=row.get("given_name"),
        )
    counts = Counter(names.values())
    numbered: Counter[str] = Counter()
    labels = {}
    for family, name in names.items():
        numbered[name] += 1
        labels[family] = name if counts[name] == 1 else f"{name} #{numbered[name]}"
    return labels


def name_of(names: dict[int, str], family: object, missing: str = NO_FAMILY) -> str:
    """A family's name among `names` (`missing` for no family, e.g. a lookup that stored and
    hit no block)."""
    if family is None or pd.isna(family):  # type: ignore[call-overload]
        return missing
    return names.get(int(family), "(family not found)")  # type: ignore[call-overload]
