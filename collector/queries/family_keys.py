"""What an operator can name a prefix family by (`kvscope names RUN --family KEY=NAME`): the
run's families, each with the request that first stored it, and the names users gave them
(collector/store/given_names.py: the run's own over the user's file)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from collector.model.family_names import name_problem
from collector.store.given_names import read_user_names, run_names
from collector.store.run_file import RunFile, StoreError


def given_names(run: RunFile) -> dict[int, str]:
    """Every name a user gave a family (the user's file, an unreadable one naming nothing;
    the run's own names over it); names that break the rules are left out."""
    try:
        user = read_user_names()
    except StoreError:
        user = {}
    return {
        family: name
        for family, name in (user | run_names(run)).items()
        if name_problem(name) is None
    }


def run_families(run: RunFile) -> pd.DataFrame:
    """Every prefix family of the run (`family`: its first block's hash), with the `tenant`
    and `lora` of its first store and the request that first stored it (`first_request`)."""
    return run.frame(
        """
        SELECT DISTINCT ON (block_hash) block_hash AS family, tenant, lora,
            first_stored_by AS first_request
        FROM prefix_blocks
        WHERE block_hash = root_hash
        ORDER BY block_hash, first_stored_ns
        """
    )


def request_families(run: RunFile, requests: Sequence[str]) -> dict[str, int]:
    """Each of `requests` (ids) the run looked up, with the family of its prompt."""
    rows = run.rows(
        """
        SELECT request_id, any_value(family) FROM lookup_causes
        WHERE list_contains($ids, request_id) AND family IS NOT NULL
        GROUP BY request_id
        """,
        {"ids": sorted(set(requests))},
    )
    return {str(request): int(family) for request, family in rows}
