"""Tenants and LoRA adapters: what each asked, hit and held, and which tenants' cached blocks
served another tenant (a timing side channel: a tenant can tell from its time to first token
that another sent the same prefix, unless their caches are salted apart)."""

from __future__ import annotations

import duckdb
import pandas as pd

from collector.time_window import TimeWindow

NO_LABEL = "(none)"


def tenant_usage(connection: duckdb.DuckDBPyConnection, window: TimeWindow) -> pd.DataFrame:
    """Per tenant and adapter: requests first admitted in the window, their prompt and hit
    tokens (and the sum of squared hit tokens, for attention FLOPs), the hit ratio, requests
    with a cache salt; blocks they stored in the window and block-seconds those held there."""
    return connection.execute(
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
    ).df()


def cross_tenant_hits(connection: duckdb.DuckDBPyConnection, window: TimeWindow) -> pd.DataFrame:
    """Block hits in the window per storing tenant x hitting tenant (the storer of the latest
    store of the hash before each hit): how many, how many hit blocks stored without a cache
    salt, and whether the pair crosses tenants (a timing side channel)."""
    return connection.execute(
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
    ).df()
