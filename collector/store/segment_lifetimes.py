"""A segmented run's cache lifetimes, derived once per closed segment and merged by readers
(docs/run-files.md, Segmented runs; segments.py writes them, segmented_run.py reads them).

When the collector closes a segment it derives, from the segment's rows and the state the
segment before left (`CARRIED`), three Parquet files beside the segment's record files:
- `cache_lifetimes`: the lifetimes that ended in the segment (evicted, or cleared by a
  reset), final, with their hits, whichever segment their store was in;
- `lifetimes_carried`: the state the next segment goes on from: the lifetimes still open at
  the segment's end (with their hits so far), and each block's latest lifetime, ended or not
  (a later hit on the block goes to no older store);
- `hit_stores`: each of the segment's block hits and the store it went to, if cached.
This is the carry a live copy makes from the copy before (copy_carry.py), from one segment
to the next: an eviction matches the latest store of its block before it (ASOF on the
engine's record numbers), a hit its block's latest store while that is cached, and a
lifetime that has ended is final. Each row keeps the segment its store was in
(`stored_segment`), so that a reader of a run whose oldest segments retention dropped
leaves out what a store in them had, as deriving from the kept rows alone does.

A reader derives the head's (the open segment's) rows the same way, from the last kept
segment's state, and makes `cache_lifetimes` of the kept segments' ended lifetimes and the
head's, each with its storing request's tenant, adapter, salt and prefix family from the
run's `requests` (derived from the kept rows, as today), and the hits' stores that
`tenant_sharing` counts (`temp.hit_stores`). That equals deriving them from every kept row,
as long as each engine's rows come after its rows in the segment before (record numbers
above its last), which an engine's one connection to its collector keeps; a segment where
that fails (an engine restarted under the same engine id) is closed without these files,
and so is every segment after it: readers derive such a run from all its rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from collector.store.lifetime_rollups import ENGINE_EVENTS, STORE_ENDS
from collector.store.reference_group import IN_REFERENCE_GROUP
from collector.store.sql_literal import path_literal

ENDED, CARRIED, HITS = "cache_lifetimes", "lifetimes_carried", "hit_stores"
DERIVED_FILES = (ENDED, CARRIED, HITS)

Execute = Callable[[str], Any]

# The columns of a lifetime in the segments' files, with their types.
_LIFETIME_COLUMNS = (
    ("engine", "VARCHAR"),
    ("rank", "INTEGER"),
    ("store_seq", "UBIGINT"),
    ("stored_ns", "BIGINT"),
    ("block_id", "INTEGER"),
    ("block_hash", "UBIGINT"),
    ("parent_hash", "UBIGINT"),
    ("block_position", "INTEGER"),
    ("kv_group", "INTEGER"),
    ("stored_by", "VARCHAR"),
    ("hits", "BIGINT"),
    ("stored_segment", "INTEGER"),
    ("ended_by", "VARCHAR"),
    ("ended_seq", "UBIGINT"),
    ("ended_at", "BIGINT"),
)


def _typed(source: str, columns: Sequence[tuple[str, str]] = _LIFETIME_COLUMNS) -> str:
    select = ", ".join(f"CAST({name} AS {kind}) AS {name}" for name, kind in columns)
    return f"SELECT {select} FROM {source}"


def _parquet(files: Sequence[str]) -> str:
    return f"read_parquet([{', '.join(path_literal(file) for file in files)}])"


def _carried_view(state: str | None, first: int) -> str:
    """`temp.carried_lifetimes`: the state a segment goes on from (none: an empty one), of
    stores in segment `first` or after."""
    if state is None:
        empty = ", ".join(f"CAST(NULL AS {kind}) AS {name}" for name, kind in _LIFETIME_COLUMNS)
        select = f"SELECT {empty} WHERE false"
    else:
        select = f"{_typed(_parquet([state]))} WHERE stored_segment >= {int(first)}"
    return f"CREATE OR REPLACE TEMP VIEW carried_lifetimes AS {select}"


def _derive_statements(events: str, number: int) -> list[str]:
    """The statements that derive a segment's lifetimes (`temp.segment_lifetimes`) and hits'
    stores (`temp.segment_hits`) from its rows (`events`) and `temp.carried_lifetimes`."""
    engine_events = ENGINE_EVENTS.replace("FROM events", f"FROM {events}")
    stored = ", ".join(name for name, _ in _LIFETIME_COLUMNS[:12])
    ends = f"""
CREATE OR REPLACE TEMP TABLE segment_lifetime_ends AS
WITH engine_events AS ({engine_events}),
stores AS (
    SELECT engine, rank, seq AS store_seq, ts_ns AS stored_ns, block_id, block_hash,
        parent_hash, block_position, kv_group, request_id AS stored_by, 0 AS hits,
        {int(number)} AS stored_segment
    FROM engine_events WHERE kind = 'store'
    UNION ALL
    SELECT {stored} FROM temp.carried_lifetimes WHERE ended_by IS NULL
),
{STORE_ENDS}"""
    candidates = "engine, rank, block_id, store_seq, ended_seq, stored_by, stored_segment"
    hits = f"""
CREATE OR REPLACE TEMP TABLE segment_hits AS
WITH hits AS (
    SELECT seq, ts_ns, request_id, block_id, coalesce(kv_group, 0) AS kv_group,
        coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank
    FROM {events} WHERE kind = 'hit'
),
candidates AS (
    SELECT {candidates} FROM temp.segment_lifetime_ends
    UNION ALL
    SELECT {candidates} FROM temp.carried_lifetimes WHERE ended_by IS NOT NULL
)
SELECT hits.*,
    ends.store_seq IS NOT NULL AND (ends.ended_seq IS NULL OR hits.seq < ends.ended_seq)
        AS cached,
    CASE WHEN cached THEN ends.store_seq END AS store_seq,
    CASE WHEN cached THEN ends.stored_by END AS stored_by,
    CASE WHEN cached THEN ends.stored_segment END AS stored_segment
FROM hits
ASOF LEFT JOIN candidates AS ends
    ON hits.engine = ends.engine AND hits.rank = ends.rank
    AND hits.block_id = ends.block_id AND ends.store_seq < hits.seq"""
    with_hits = (
        "(SELECT * REPLACE (hits + coalesce(new_hits, 0) AS hits) "
        "FROM temp.segment_lifetime_ends "
        "LEFT JOIN lifetime_hits USING (engine, rank, store_seq, block_id))"
    )
    lifetimes = f"""
CREATE OR REPLACE TEMP TABLE segment_lifetimes AS
WITH lifetime_hits AS (
    SELECT engine, rank, store_seq, block_id, count(*) AS new_hits
    FROM temp.segment_hits WHERE cached GROUP BY ALL
)
SELECT *, false AS ended_before FROM ({_typed(with_hits)})
UNION ALL
SELECT *, true AS ended_before FROM temp.carried_lifetimes WHERE ended_by IS NOT NULL"""
    return [ends, hits, lifetimes, "DROP TABLE temp.segment_lifetime_ends"]


# Where an engine's rows of a segment do not come after those of the state it goes on from.
_OUT_OF_ORDER = """
SELECT count(*) FROM (
    SELECT coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank, min(seq) AS first
    FROM {events} GROUP BY ALL
) AS new
JOIN (
    SELECT engine, rank, max(greatest(store_seq, coalesce(ended_seq, 0))) AS last
    FROM temp.carried_lifetimes GROUP BY ALL
) AS before USING (engine, rank)
WHERE new.first <= before.last"""


def derive_segment(
    execute: Execute, events: str, number: int, state: str | None, first: int = 0
) -> bool:
    """Derive segment `number`'s lifetimes and hits' stores from its rows (`events`) and the
    `state` file the segment before left (None: the run's first, or retention dropped it),
    of stores in segment `first` or after; False, with nothing derived, where its rows do
    not follow on from the state (above)."""
    execute(_carried_view(state, first))
    row = execute(_OUT_OF_ORDER.format(events=events))
    if row and row[0]:
        execute("DROP VIEW temp.carried_lifetimes")
        return False
    for statement in _derive_statements(events, number):
        execute(statement)
    execute("DROP VIEW temp.carried_lifetimes")
    return True


def write_segment(
    execute: Execute, number: int, state: str | None, folder: Path, stem: str
) -> bool:
    """Derive segment `number` (the rows of `events`) and write its three files under
    `folder` (each `<file>/<stem>.parquet`); False where it cannot be (`derive_segment`)."""
    if not derive_segment(execute, "events", number, state):
        return False
    outputs = {
        ENDED: "SELECT * EXCLUDE (ended_before) FROM temp.segment_lifetimes "
        "WHERE ended_by IS NOT NULL AND NOT ended_before",
        CARRIED: "SELECT * EXCLUDE (ended_before) FROM temp.segment_lifetimes "
        "QUALIFY ended_by IS NULL "
        "OR store_seq = max(store_seq) OVER (PARTITION BY engine, rank, block_id)",
        HITS: "SELECT ts_ns, request_id, kv_group, cached, stored_by, stored_segment "
        "FROM temp.segment_hits",
    }
    for name, select in outputs.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        target = folder / name / f"{stem}.parquet"
        execute(f"COPY ({select}) TO {path_literal(target)} (FORMAT PARQUET)")
    execute("DROP TABLE temp.segment_lifetimes")
    execute("DROP TABLE temp.segment_hits")
    return True


# -- reading --------------------------------------------------------------------------------

_ROOTS = f"""
    SELECT request_id, any_value(block_hash) AS root_hash
    FROM events
    WHERE kind IN ('hit', 'store') AND block_position = 0 AND {IN_REFERENCE_GROUP}
    GROUP BY request_id"""


def merged_lifetimes(ended: Sequence[str], first: int) -> str:
    """`cache_lifetimes` of the kept segments' `ended` files (of stores in segment `first`
    or after) and the head's lifetimes (`temp.segment_lifetimes`), as WHOLE_CACHE_LIFETIMES
    makes it from every kept row."""
    sources = ["SELECT * EXCLUDE (ended_before) FROM temp.segment_lifetimes WHERE NOT ended_before"]
    if ended:
        sources.insert(0, f"{_typed(_parquet(ended))} WHERE stored_segment >= {int(first)}")
    return f"""
CREATE OR REPLACE TABLE cache_lifetimes AS
WITH lifetimes AS ({" UNION ALL ".join(sources)}),
request_roots AS ({_ROOTS})
SELECT block_hash, parent_hash, block_position, block_id, kv_group, store_seq, stored_ns,
    coalesce(ended_at, grid.end_ns) AS ended_ns, ended_by, stored_by, requests.tenant,
    requests.lora, requests.salt_hash, request_roots.root_hash, hits, engine, rank, ended_seq
FROM lifetimes
LEFT JOIN requests ON requests.request_id = lifetimes.stored_by
LEFT JOIN request_roots ON request_roots.request_id = lifetimes.stored_by
CROSS JOIN rollup_grid AS grid
ORDER BY engine, rank, store_seq, block_position;

DROP TABLE temp.segment_lifetimes"""


def merged_hit_stores(hits: Sequence[str], first: int) -> str:
    """`temp.hit_stores` (what `tenant_sharing` counts) of the kept segments' `hits` files
    and the head's (`temp.segment_hits`): a hit's store in a dropped segment is none."""
    columns = "ts_ns, request_id, kv_group, cached, stored_by, stored_segment"
    sources = [f"SELECT {columns} FROM temp.segment_hits"]
    if hits:
        sources.insert(0, f"SELECT {columns} FROM {_parquet(hits)}")
    return f"""
CREATE OR REPLACE TEMP TABLE hit_stores AS
WITH hits AS (
    SELECT * REPLACE (coalesce(cached AND stored_segment >= {int(first)}, false) AS cached)
    FROM ({" UNION ALL ".join(sources)})
)
SELECT hits.ts_ns, hits.request_id, hits.kv_group,
    CASE WHEN cached THEN stores.tenant END AS stored_tenant,
    CASE WHEN cached THEN stores.lora END AS stored_lora,
    CASE WHEN cached THEN stores.salt_hash END AS stored_salt
FROM hits
LEFT JOIN requests AS stores ON stores.request_id = hits.stored_by;

DROP TABLE temp.segment_hits"""
