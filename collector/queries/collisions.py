"""Hash collisions: a block hash matched but the block's content did not, so one prompt was
served another's KV. Zero is a result too: how many hits were checked, under which hash."""

from __future__ import annotations

from typing import TypedDict

import pandas as pd

from collector.model.time_window import TimeWindow
from collector.store.run_file import RunFile


def collision_rows(run: RunFile, window: TimeWindow) -> pd.DataFrame:
    """Every collision in the window: when, the request served the wrong KV and the one that
    stored it (with their tenants), the block, its hash and both fingerprints."""
    frame = run.frame(
        """
        SELECT (collisions.ts_ns - $origin) / 1e9 AS t_s,
            collisions.request_id, served.tenant AS request_tenant,
            collisions.stored_by, stored.tenant AS stored_by_tenant,
            collisions.block_id, collisions.block_hash,
            hex(collisions.stored_fingerprint) AS stored_fingerprint,
            hex(collisions.request_fingerprint) AS request_fingerprint,
            collisions.engine_id, collisions.dp_rank
        FROM collisions
        LEFT JOIN requests AS served ON served.request_id = collisions.request_id
        LEFT JOIN requests AS stored ON stored.request_id = collisions.stored_by
        WHERE collisions.ts_ns >= $start AND collisions.ts_ns < $end
        ORDER BY collisions.seq
        """,
        {"origin": window.run_start_ns, "start": window.start_ns, "end": window.end_ns},
    )
    frame["block_hash"] = [f"{int(value):016x}" for value in frame["block_hash"]]
    return frame


class CollisionCheck(TypedDict):
    checked: bool
    collisions: int
    hits_checked: int
    hash_algo: str


def collision_check(run: RunFile, window: TimeWindow) -> CollisionCheck:
    """Whether the run checked hits for collisions, collisions found in the window, block
    hits checked there (every hit, when the check was on), and the run's hash."""
    row = run.row(
        """
        SELECT CAST(coalesce(sum(collisions), 0) AS BIGINT),
            CAST(coalesce(sum(block_hits), 0) AS BIGINT),
            (SELECT hash_algo FROM runs),
            (SELECT coalesce(CAST(json_extract(options, '$.check_collisions') AS BOOLEAN), false)
             FROM runs)
        FROM time_rollup
        WHERE bucket BETWEEN $first AND $last
        """,
        {"first": window.first_bucket, "last": window.last_bucket},
    )
    assert row is not None
    checked = bool(row[3])
    return {
        "checked": checked,
        "collisions": int(row[0]),
        "hits_checked": int(row[1]) if checked else 0,
        "hash_algo": row[2],
    }
