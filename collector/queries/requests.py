"""A run's recorded requests, read back as trace requests so they can be replayed again.

Needs the prompt token ids, which a run holds only when it was recorded with
`--record-token-ids`. Output tokens are not recorded as such; the blocks a request's decoded
tokens completed are (`block_tokens`), and they are all a later request can reuse, so those
tokens come back and the rest of the output gets unique stand-ins, as in any replay.
Tenants and salts come back as the run stored them (labels and keyed hashes): equal stays
equal, which is all the cache sees.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from collector.simulator import OUTPUT_TOKEN_BASE
from collector.store import StoreError
from collector.traces import TraceRequest

_REQUESTS_SQL = """
WITH arrivals AS (
    SELECT request_id, min(seq) AS arrive_seq FROM events WHERE kind = 'arrive' GROUP BY ALL
),
block_contents AS (
    SELECT block_hash, any_value(token_ids) AS token_ids FROM block_tokens GROUP BY ALL
),
output_blocks AS (
    SELECT events.request_id,
        list(block_contents.token_ids ORDER BY events.block_position) AS token_lists,
        min(events.block_position) AS first_position
    FROM events
    JOIN requests USING (request_id)
    JOIN block_contents USING (block_hash)
    WHERE events.kind = 'store'
        AND events.block_position >= requests.num_prompt_tokens // (SELECT block_size FROM runs)
    GROUP BY ALL
)
SELECT requests.request_id, requests.arrival_ns, requests.num_prompt_tokens,
    coalesce(requests.num_output_tokens, 0), requests.tenant, requests.lora,
    requests.salt_hash, request_tokens.token_ids, output_blocks.token_lists,
    output_blocks.first_position
FROM requests
JOIN arrivals USING (request_id)
LEFT JOIN request_tokens USING (request_id)
LEFT JOIN output_blocks USING (request_id)
ORDER BY arrivals.arrive_seq
"""


def has_token_ids(connection: duckdb.DuckDBPyConnection) -> bool:
    """Whether the run recorded prompt token ids (`--record-token-ids`)."""
    row = connection.execute("SELECT count(*) FROM request_tokens").fetchone()
    return row is not None and row[0] > 0


def requests_from_run(connection: duckdb.DuckDBPyConnection, path: Path) -> list[TraceRequest]:
    """The run's requests in arrival order, with their prompts; `path` names it in errors."""
    if not has_token_ids(connection):
        raise StoreError(
            f"{path}: the run holds no prompt token ids (it was recorded without "
            "--record-token-ids), so its requests cannot be replayed; replay its trace instead"
        )
    block_size = int(connection.execute("SELECT block_size FROM runs").fetchone()[0])  # type: ignore[index]
    rows = connection.execute(_REQUESTS_SQL).fetchall()
    first_ns = min(row[1] for row in rows)
    requests = []
    for index, row in enumerate(rows):
        request_id, arrival_ns, num_prompt, num_output, tenant, lora, salt, tokens = row[:8]
        if tokens is None:
            raise StoreError(f"{path}: request {request_id} has no recorded token ids")
        requests.append(
            TraceRequest(
                line=index + 1,
                request_id=request_id,
                timestamp_ms=(arrival_ns - first_ns) / 1e6,
                num_prompt_tokens=num_prompt,
                output_length=num_output,
                tenant=tenant,
                lora=lora,
                cache_salt=salt,
                token_ids=tuple(tokens),
                output_token_ids=_output_tokens(index, num_prompt, num_output, block_size, row[8:]),
            )
        )
    return requests


def _output_tokens(
    index: int,
    num_prompt: int,
    num_output: int,
    block_size: int,
    stored: tuple[list[list[int]] | None, int | None],
) -> tuple[int, ...] | None:
    """The output tokens the run's stored blocks hold, then unique stand-ins."""
    token_lists, first_position = stored
    if not token_lists or num_output == 0 or first_position != num_prompt // block_size:
        return None
    known = [token for block in token_lists for token in block]
    known = known[num_prompt - first_position * block_size :][:num_output]
    base = OUTPUT_TOKEN_BASE + (index << 12)
    return tuple(known) + tuple(base + position for position in range(len(known), num_output))
