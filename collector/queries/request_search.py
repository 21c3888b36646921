"""Finding a request of a run: by its id, its tenant or a piece of its prompt, and what the
Requests page shows beside its lookups (its row, its prompt's token ids, the tenants of the
requests that evicted its blocks), and the first block of a prefix family, which names it.

A prompt is matched on its recorded token ids (`--record-token-ids`): the caller encodes the
text it looks for with the run's tokenizer, and a request matches when that run of token ids
is inside its prompt. A tokenizer cuts a word the same way wherever it stands after a space,
so a whole word or phrase is found; a piece of a word may be cut otherwise and is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from collector.queries.family_keys import given_names
from collector.store.run_file import RunFile

MATCHES = ("request id", "tenant", "prompt text")

_FIND = """
WITH found AS (
    SELECT request_id, 0 AS matched FROM requests
    WHERE contains(lower(request_id), lower($text))
    UNION ALL
    SELECT request_id, 1 FROM requests WHERE list_contains($tenants, tenant)
    UNION ALL
    SELECT request_id, 2 FROM request_tokens, (SELECT unnest($prompts) AS needle)
    WHERE contains(',' || array_to_string(token_ids, ',') || ',', ',' || needle || ',')
),
best AS (SELECT request_id, min(matched) AS matched FROM found GROUP BY ALL)
SELECT request_id, $names[matched + 1] AS matched, tenant, lora, arrival_ns,
    num_prompt_tokens, num_hit_tokens, num_preemptions
FROM best JOIN requests USING (request_id)
ORDER BY lower(request_id) = lower($text) DESC, matched, arrival_ns, request_id
LIMIT $limit
"""


def find_requests(
    run: RunFile,
    text: str,
    tenants: Sequence[str] = (),
    prompts: Sequence[Sequence[int]] = (),
    limit: int = 100,
) -> pd.DataFrame:
    """The requests (at most `limit`) whose id holds `text` (any case), whose tenant is one of
    `tenants` (labels as stored), or whose prompt holds one of `prompts` (token ids in a
    row): `request_id`, what it `matched` on (MATCHES: the first of them), `tenant`, `lora`,
    `arrival_ns`, `num_prompt_tokens`, `num_hit_tokens`, `num_preemptions`; an id equal to
    `text` first, then by what matched and arrival."""
    return run.frame(
        _FIND,
        {
            "text": text.strip(),
            "tenants": list(tenants),
            "prompts": [",".join(str(token) for token in ids) for ids in prompts if ids],
            "names": list(MATCHES),
            "limit": limit,
        },
    )


def run_tenants(run: RunFile) -> list[str]:
    """Every tenant label of the run's requests, as stored (pseudonyms included)."""
    rows = run.rows("SELECT DISTINCT tenant FROM requests WHERE tenant IS NOT NULL ORDER BY 1")
    return [str(row[0]) for row in rows]


def request_row(run: RunFile, request: str) -> dict[str, Any] | None:
    """The request's row of `requests` (None for no such request)."""
    return run.record("SELECT * FROM requests WHERE request_id = $request", {"request": request})


def prompt_token_ids(run: RunFile, request: str) -> list[int] | None:
    """The request's prompt token ids, where the run recorded them (else None)."""
    row = run.row(
        "SELECT token_ids FROM request_tokens WHERE request_id = $request", {"request": request}
    )
    return None if row is None else list(row[0])


def request_tenants(run: RunFile, requests: Sequence[str]) -> dict[str, str | None]:
    """Each of `requests` (ids) that the run holds, with its tenant."""
    rows = run.rows(
        "SELECT request_id, tenant FROM requests WHERE list_contains($ids, request_id)",
        {"ids": sorted(set(requests))},
    )
    return {str(request): tenant for request, tenant in rows}


def family_roots(run: RunFile, families: Sequence[int]) -> pd.DataFrame:
    """Each prefix family's first block (`family`: its hash, as `lookup_causes` names a
    family): the `tenant` and `lora` of its first store, the request that first stored it
    (`first_request`), its recorded `token_ids` (None where the run recorded none) and the
    name a user gave it (`given_name`, None where none); what collector/model/family_names.py
    names a family by."""
    roots = run.frame(
        """
        SELECT DISTINCT ON (block_hash) block_hash AS family, tenant, lora,
            first_stored_by AS first_request,
            (SELECT any_value(token_ids) FROM block_tokens
             WHERE block_tokens.block_hash = prefix_blocks.block_hash) AS token_ids
        FROM prefix_blocks
        WHERE block_hash IN (SELECT CAST(unnest($families) AS UBIGINT))
        """,
        {"families": [str(int(family)) for family in families]},
    )
    given = given_names(run)
    roots["given_name"] = [given.get(int(family)) for family in roots["family"]]
    return roots
