"""The Overview's words for a run's block size and pools: one engine's ("block size 16, 1,200
blocks"), a fleet's whose engines ran alike ("block size 16, 4 engines of 1,200 blocks
each"), or, where they did not, each kind of engine with its own ("block size 16, 2 engines:
120 blocks (host:1), 200 blocks (host:2)"; with block sizes that differ too, "2 engines:
block size 16, 120 blocks (host:1); block size 32, 200 blocks (host:2)"), from
`fleet.engine_starts`. An engine whose settings a capture did not keep (one made before the
collector kept each engine's) is said by the usable blocks of its pool steps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from collector.queries.fleet import engine_labels, lineage_ids

MAX_NAMED = 3  # the engines named in a kind of engine; more are counted


def pool_words(
    starts: pd.DataFrame,
    config: Mapping[str, Any],
    lineages: Mapping[tuple[str, int], str] | None = None,
) -> str:
    """The block size and pool of the run's engines (`config`, the runs row: a run of one
    engine or none). `lineages` (`fleet.engine_lineages`): the starts of one engine restarted
    under its id are counted as its starts ("1 engine (2 starts) of 2,000 blocks each")."""
    if len(starts) <= 1:
        return f"block size {config['block_size']}, {int(config['num_blocks']):,} blocks"
    kinds = _kinds(starts)
    count = _count(starts, lineages or {})
    if len(kinds) == 1:
        ((size, pool),) = kinds
        return f"{size}, {count} of {pool} each"
    if len({size for size, _ in kinds}) == 1:
        size = next(iter(kinds))[0]
        each = (f"{pool} ({_named(named)})" for (_, pool), named in kinds.items())
        return f"{size}, {count}: " + ", ".join(each)
    each = (f"{size}, {pool} ({_named(named)})" for (size, pool), named in kinds.items())
    return f"{count}: " + "; ".join(each)


def _count(starts: pd.DataFrame, lineages: Mapping[tuple[str, int], str]) -> str:
    """The run's engines, and their starts where one engine started more than once."""
    ids = lineage_ids(starts["engine_id"], starts["dp_rank"], lineages)
    engines = len(set(zip(ids, starts["dp_rank"], strict=True)))
    words = f"{engines} engine" + ("" if engines == 1 else "s")
    return words if engines == len(starts) else f"{words} ({len(starts)} starts)"


def alike(starts: pd.DataFrame) -> bool:
    """Whether the run's engines all ran with one block size and pool (one engine or none:
    the run's own)."""
    return len(starts) <= 1 or len(_kinds(starts)) == 1


def _kinds(starts: pd.DataFrame) -> dict[tuple[str, str], list[str]]:
    """The engines' names by their block size and pool, in words."""
    names = engine_labels(starts["engine_id"], starts["dp_rank"])
    kinds: dict[tuple[str, str], list[str]] = {}
    for engine, name in zip(starts.to_dict("records"), names, strict=True):
        kinds.setdefault(_settings(engine), []).append(name)
    return kinds


def _settings(engine: Mapping[Any, Any]) -> tuple[str, str]:
    """An engine's block size and pool, in words."""
    size = engine["block_size"]
    size_words = "block size not recorded" if pd.isna(size) else f"block size {int(size)}"
    blocks, usable = engine["num_blocks"], engine["pool_blocks"]
    if not pd.isna(blocks):
        return size_words, f"{int(blocks):,} blocks"
    if not pd.isna(usable):
        return size_words, f"{int(usable):,} usable blocks"
    return size_words, "a pool not recorded"


def _named(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= MAX_NAMED else f"{len(names)} engines"
