"""The advisor's own named queries over one run file (the shared ones are in collector/queries)."""

from __future__ import annotations

import duckdb
import pandas as pd


def mean_hit_tokens(connection: duckdb.DuckDBPyConnection, request_ids: list[str]) -> float:
    """Average prefix-hit tokens of the given requests (at their first admission)."""
    row = connection.execute(
        "SELECT avg(num_hit_tokens) FROM requests WHERE list_contains($ids, request_id)",
        {"ids": request_ids},
    ).fetchone()
    return 0.0 if row is None or row[0] is None else float(row[0])


def salt_usage(connection: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Per tenant and cache salt (keyed hash): requests, prompt and hit tokens."""
    return connection.execute(
        """
        SELECT tenant, salt_hash, count(*) AS requests,
            sum(num_prompt_tokens) AS prompt_tokens, sum(num_hit_tokens) AS hit_tokens
        FROM requests
        WHERE num_prompt_tokens IS NOT NULL
        GROUP BY ALL
        ORDER BY tenant, salt_hash
        """
    ).df()


def cross_tenant_hits(connection: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Blocks one tenant's requests hit that another tenant's request stored (the latest
    store of that hash before the hit): reader, writer, the reader's salt, blocks, requests."""
    return connection.execute(
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
    ).df()


def num_tenants(connection: duckdb.DuckDBPyConnection) -> int:
    """Distinct tenants (labels) among the run's requests."""
    row = connection.execute("SELECT count(DISTINCT tenant) FROM requests").fetchone()
    return 0 if row is None else int(row[0])


def num_collisions(connection: duckdb.DuckDBPyConnection) -> int:
    row = connection.execute("SELECT count(*) FROM collisions").fetchone()
    return 0 if row is None else int(row[0])


def first_block_references(connection: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Every use of a request's first block, in order: hit or store, when, which hash."""
    return connection.execute(
        """
        SELECT events.request_id, events.kind::VARCHAR AS kind, events.ts_ns, events.block_hash,
            requests.num_hit_tokens, requests.tenant
        FROM events JOIN requests USING (request_id)
        WHERE events.kind IN ('hit', 'store') AND events.block_position = 0
        ORDER BY events.seq
        """
    ).df()


def eviction_times(connection: duckdb.DuckDBPyConnection, block_hashes: list[int]) -> pd.DataFrame:
    """When blocks with the given hashes were evicted."""
    return connection.execute(
        """
        SELECT block_hash, ts_ns FROM events
        WHERE kind = 'evict' AND list_contains($hashes, block_hash)
        ORDER BY seq
        """,
        {"hashes": block_hashes},
    ).df()
