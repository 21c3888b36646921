"""Short, stable names for pseudonyms, so an operator can tell tenants apart at a glance.

A pseudonymous tenant or adapter (`tenant-0e13a5b7c9d1`, `lora-…`: engine_hooks/privacy.py)
is shown as two words picked by its own digits (`tenant-0e13a5b7c9d1` is always the same
pair, on every page and in every run made with the same secret). Two pseudonyms that pick
the same pair among those shown together keep their first hex digits after it. Names a user
chose to keep (`--reveal-tenants`) are shown as they are.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

import pandas as pd

PSEUDONYM = re.compile(r"(?:tenant|lora)-(?P<digits>[0-9a-f]{12})")
# fmt: off
ADJECTIVES = (
    "amber", "azure", "bold", "brisk", "calm", "cedar", "clear", "coral", "crisp", "dawn",
    "deep", "dusky", "eager", "early", "fair", "fern", "fleet", "frost", "gentle", "gold",
    "grand", "green", "hazel", "ivory", "jade", "keen", "lemon", "lively", "lucky", "maple",
    "merry", "mint", "misty", "noble", "north", "ochre", "olive", "pearl", "plum", "proud",
    "quick", "quiet", "rapid", "red", "royal", "ruby", "rustic", "sage", "sandy", "scarlet",
    "silent", "silver", "slate", "snowy", "solar", "spruce", "steady", "stone", "sunny",
    "swift", "tidal", "topaz", "velvet", "windy",
)
ANIMALS = (
    "badger", "bear", "beaver", "bison", "crane", "crow", "deer", "dolphin", "eagle", "egret",
    "falcon", "finch", "fox", "gecko", "goose", "hare", "hawk", "heron", "ibis", "jackal",
    "jay", "koala", "lark", "lemur", "lion", "lynx", "magpie", "marten", "mink", "moose",
    "newt", "orca", "osprey", "otter", "owl", "panda", "panther", "pelican", "puffin", "quail",
    "raven", "robin", "salmon", "seal", "shark", "sparrow", "squid", "stork", "swan", "tapir",
    "tiger", "toad", "trout", "turtle", "viper", "walrus", "weasel", "whale", "wolf", "wombat",
    "wren", "yak", "zebra", "ermine",
)
# fmt: on


def nickname(label: str) -> str:
    """Two words for a pseudonym (`tenant-0e13a5b7c9d1` -> `frost-quail`); anything else
    unchanged."""
    match = PSEUDONYM.fullmatch(label)
    if match is None:
        return label
    value = int(match["digits"], 16)
    return f"{ADJECTIVES[value % len(ADJECTIVES)]}-{ANIMALS[value // 64 % len(ANIMALS)]}"


def nicknames(labels: Iterable[str]) -> dict[str, str]:
    """Each distinct label's nickname; where pseudonyms shown together get the same one,
    each keeps as many of its first hex digits after it (4 or more) as tell them apart."""
    named = {label: nickname(label) for label in set(labels)}
    clashes: dict[str, list[str]] = defaultdict(list)
    for label, name in named.items():
        if name != label:
            clashes[name].append(label)
    for name, group in clashes.items():
        if len(group) > 1:
            digits = {label: label.split("-")[1] for label in group}
            width = next(
                width
                for width in range(4, 13)
                if len({value[:width] for value in digits.values()}) == len(group)
            )
            named |= {label: f"{name}-{digits[label][:width]}" for label in group}
    return named


def with_nicknames(frame: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """The frame with pseudonyms in `columns` replaced by their nicknames (one naming over
    all the columns, so a tenant has one name in each); missing values kept."""
    shown = [column for column in columns if column in frame.columns]
    labels = {str(label) for column in shown for label in frame[column].dropna()}
    names = nicknames(labels)
    renamed = frame.copy()
    for column in shown:
        renamed[column] = frame[column].replace(names)
    return renamed
