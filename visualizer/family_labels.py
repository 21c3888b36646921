"""Prefix families by name on every page: collector/model/family_names.py names them (the
start of the first block's text where the run recorded token ids and its tokenizer is on this
machine, else the first storer's tenant and request), as `kvscope explain` does. The hash
stays in hovers and downloads, never as the name."""

from __future__ import annotations

from collections.abc import Iterable

from collector.model.family_names import family_names
from collector.queries.request_search import family_roots
from collector.store.run_file import RunFile
from visualizer.run_tokenizer import run_tokenizer


def named_families(run: RunFile, families: Iterable[object]) -> dict[int, str]:
    """Each of `families` (first-block hashes, as integers or decimal strings; others are
    left out) by name."""
    wanted = sorted({int(str(family)) for family in families if str(family).isdigit()})
    if not wanted:
        return {}
    tokenizer = run_tokenizer(run)
    return family_names(
        family_roots(run, wanted), tokenizer.decode if tokenizer is not None else None
    )
