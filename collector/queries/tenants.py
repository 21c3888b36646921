"""Tenants and LoRA adapters: what each asked, hit and held, and which tenants' cached blocks
served another tenant (a timing side channel: a tenant can tell from its time to first token
that another sent the same prefix, unless their caches are salted apart)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from collector.model.nicknames import nickname
from collector.model.time_window import TimeWindow
from collector.safe_text import shown
from collector.store.run_file import RunFile

NO_LABEL = "(none)"


def tenant_usage(run: RunFile, window: TimeWindow) -> pd.DataFrame:
    """Per tenant and adapter: requests first admitted in the window, their prompt and hit
    tokens (and the sum of squared hit tokens, for attention FLOPs), the hit ratio, requests
    with a cache salt; blocks they stored in the window and block-seconds those held there."""
    return run.frame(
        """
        WITH asked AS (
            SELECT coalesce(tenant, $none) AS tenant, coalesce(lora, $none) AS lora,
                count(*) AS requests,
                CAST(sum(num_prompt_tokens) AS BIGINT) AS prompt_tokens,
                CAST(sum(num_hit_tokens) AS BIGINT) AS hit_tokens,
                CAST(sum(CAST(num_hit_tokens AS BIGINT) * num_hit_tokens) AS BIGINT)
                    AS hit_tokens_squared,
                count(salt_hash) AS salted_requests
            FROM requests
            WHERE num_hit_tokens IS NOT NULL
                AND first_scheduled_ns >= $start AND first_scheduled_ns < $end
            GROUP BY ALL
        ),
        held AS (
            SELECT coalesce(tenant, $none) AS tenant, coalesce(lora, $none) AS lora,
                count(*) FILTER (WHERE stored_ns >= $start) AS blocks_stored,
                sum(least(ended_ns, $end) - greatest(stored_ns, $start)) / 1e9 AS block_seconds
            FROM cache_lifetimes
            WHERE stored_ns < $end AND ended_ns > $start
            GROUP BY ALL
        )
        SELECT tenant, lora,
            coalesce(requests, 0) AS requests,
            coalesce(prompt_tokens, 0) AS prompt_tokens,
            coalesce(hit_tokens, 0) AS hit_tokens,
            coalesce(hit_tokens_squared, 0) AS hit_tokens_squared,
            coalesce(hit_tokens / nullif(prompt_tokens, 0), 0) AS hit_ratio,
            coalesce(salted_requests, 0) AS salted_requests,
            coalesce(blocks_stored, 0) AS blocks_stored,
            coalesce(block_seconds, 0) AS block_seconds,
            coalesce(block_seconds, 0) / $duration_s AS mean_blocks_held
        FROM asked
        FULL JOIN held USING (tenant, lora)
        ORDER BY tenant, lora
        """,
        {
            "start": window.start_ns,
            "end": window.end_ns,
            "duration_s": window.duration_s,
            "none": NO_LABEL,
        },
    )


def cross_tenant_hits(run: RunFile, window: TimeWindow) -> pd.DataFrame:
    """Block hits in the window per storing tenant x hitting tenant (the storer of the latest
    store of the hash before each hit): how many, how many hit blocks stored without a cache
    salt, and whether the pair crosses tenants (a timing side channel)."""
    return run.frame(
        """
        SELECT coalesce(stored_tenant, $none) AS stored_tenant,
            coalesce(hit_tenant, $none) AS hit_tenant,
            CAST(sum(block_hits) AS BIGINT) AS block_hits,
            CAST(coalesce(sum(block_hits) FILTER (WHERE stored_salt IS NULL), 0) AS BIGINT)
                AS unsalted_hits,
            coalesce(stored_tenant, $none) <> coalesce(hit_tenant, $none) AS cross_tenant
        FROM tenant_sharing
        WHERE bucket BETWEEN $first AND $last
        GROUP BY ALL
        ORDER BY stored_tenant, hit_tenant
        """,
        {"first": window.first_bucket, "last": window.last_bucket, "none": NO_LABEL},
    )


def tenant_hit_ratios(run: RunFile) -> pd.DataFrame:
    """Per tenant and LoRA adapter: requests, prompt and hit tokens, and the hit ratio."""
    return run.frame(
        """
        SELECT
            coalesce(tenant, $none) AS tenant,
            coalesce(lora, $none) AS lora,
            count(*) AS requests,
            sum(num_prompt_tokens) AS prompt_tokens,
            sum(num_hit_tokens) AS hit_tokens,
            sum(num_hit_tokens) / nullif(sum(num_prompt_tokens), 0) AS hit_ratio
        FROM requests
        WHERE num_hit_tokens IS NOT NULL
        GROUP BY ALL
        ORDER BY tenant, lora
        """,
        {"none": NO_LABEL},
    )


@dataclass(frozen=True)
class TenantHitRatio:
    """One `tenant_hit_ratios` row, counts as ints and the hit ratio as a float."""

    tenant: str
    lora: str
    requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_ratio: float


def tenant_label(row: TenantHitRatio) -> str:
    """A tenant's name: `tenant`, or `tenant/adapter` for requests that ran with a LoRA
    adapter (pseudonyms by their nicknames)."""
    tenant, lora = shown(nickname(row.tenant)), shown(nickname(row.lora))
    return tenant if row.lora == NO_LABEL else f"{tenant}/{lora}"


def salt_usage(run: RunFile) -> pd.DataFrame:
    """Per tenant and cache salt (keyed hash): requests, prompt and hit tokens."""
    return run.frame(
        """
        SELECT tenant, salt_hash, count(*) AS requests,
            sum(num_prompt_tokens) AS prompt_tokens, sum(num_hit_tokens) AS hit_tokens
        FROM requests
        WHERE num_prompt_tokens IS NOT NULL
        GROUP BY ALL
        ORDER BY tenant, salt_hash
        """
    )


def cross_tenant_readers(run: RunFile) -> pd.DataFrame:
    """Blocks one tenant's requests hit that another tenant's request stored (the latest
    store of that hash before the hit): reader, writer, the reader's salt, blocks, requests."""
    return run.frame(
        """
        WITH owners AS (SELECT request_id, tenant, salt_hash FROM requests),
        stores AS (
            SELECT events.seq, events.block_hash, owners.tenant
            FROM events JOIN owners USING (request_id)
            WHERE events.kind = 'store'
        ),
        hits AS (
            SELECT events.seq, events.block_hash, events.request_id, owners.tenant,
                owners.salt_hash
            FROM events JOIN owners USING (request_id)
            WHERE events.kind = 'hit'
        )
        SELECT hits.tenant AS reader, stores.tenant AS writer,
            any_value(hits.salt_hash) AS salt_hash,
            count(*) AS blocks, count(DISTINCT hits.request_id) AS requests
        FROM hits ASOF JOIN stores
            ON hits.block_hash = stores.block_hash AND hits.seq > stores.seq
        WHERE hits.tenant IS NOT NULL AND stores.tenant IS NOT NULL
            AND hits.tenant <> stores.tenant
        GROUP BY ALL
        ORDER BY blocks DESC, reader, writer
        """
    )


def num_tenants(run: RunFile) -> int:
    """Distinct tenants (labels) among the run's requests."""
    row = run.row("SELECT count(DISTINCT tenant) FROM requests")
    return 0 if row is None else int(row[0])


def labels_in_run(run: RunFile) -> list[tuple[str, str]]:
    """Every (kind, label) the run's requests carry: kind "tenant", "adapter" or "salt"."""
    rows = run.rows(
        """
        WITH arrivals AS (
            SELECT DISTINCT tenant, lora, salt_hash FROM events WHERE kind = 'arrive'
        )
        SELECT DISTINCT 'tenant', tenant FROM arrivals WHERE tenant IS NOT NULL
        UNION SELECT DISTINCT 'adapter', lora FROM arrivals WHERE lora IS NOT NULL
        UNION SELECT DISTINCT 'salt', salt_hash FROM arrivals WHERE salt_hash IS NOT NULL
        """
    )
    return sorted((str(kind), str(label)) for kind, label in rows)
