"""What `kvscope explain` shows beside a run's miss causes (miss_causes.py): the tenants of
the requests it names, the owners of the prefix families it names, one request's figures and
its prompt's token ids."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from collector.store.run_file import RunFile


def request_record(run: RunFile, request: str) -> dict[str, Any] | None:
    """A request's row of the `requests` table (tenant, adapter, prompt and hit tokens,
    preemptions), or None when the run has no such request."""
    return run.record(
        """SELECT request_id, tenant, lora, num_prompt_tokens, num_hit_tokens,
            num_preemptions, arrival_ns
        FROM requests WHERE request_id = $request""",
        {"request": request},
    )


def request_prompt(run: RunFile, request: str) -> list[int] | None:
    """The request's prompt token ids, when the run recorded them (`--record-token-ids`)."""
    row = run.row(
        "SELECT token_ids FROM request_tokens WHERE request_id = $request", {"request": request}
    )
    return None if row is None else list(row[0])


def request_tenants(run: RunFile, requests: Iterable[str]) -> dict[str, str | None]:
    """Each request's tenant (None: none), for the requests of the run among `requests`."""
    rows = run.rows(
        "SELECT request_id, tenant FROM requests WHERE list_contains($ids, request_id)",
        {"ids": sorted(set(requests))},
    )
    return {str(request): tenant for request, tenant in rows}
