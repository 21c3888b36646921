"""A run's requests: read back as trace requests so they can be replayed again, as the
block stream the miss-ratio curve reads, and the figures the advisor asks of them.

Needs the prompt token ids, which a run holds only when it was recorded with
`--record-token-ids`. Output tokens are not recorded as such; the blocks a request's decoded
tokens completed are (`block_tokens`), and they are all a later request can reuse, so those
tokens come back and the rest of the output gets unique stand-ins, as in any replay.
Tenants and salts come back as the run stored them (labels and keyed hashes): equal stays
equal, which is all the cache sees. On a run of several engines each request belongs to the
engine it arrived at (`request_engines`), and each engine's pool reads its own block stream
(`engine_block_streams`).
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path

import pandas as pd

from collector.model.block_stream import RequestBlocks, num_kv_tokens
from collector.model.trace_request import OUTPUT_TOKEN_BASE, TraceRequest
from collector.queries.config import run_config
from collector.store.run_file import RunFile, StoreError

Engine = tuple[str, int]  # engine id ('' when unnamed) and DP rank: one pool of a fleet

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


def has_token_ids(run: RunFile) -> bool:
    """Whether the run recorded prompt token ids (`--record-token-ids`)."""
    row = run.row("SELECT count(*) FROM request_tokens")
    return row is not None and row[0] > 0


def requests_from_run(run: RunFile, path: Path) -> list[TraceRequest]:
    """The run's requests in arrival order, with their prompts; `path` names it in errors."""
    if not has_token_ids(run):
        raise StoreError(
            f"{path}: the run holds no prompt token ids (it was recorded without "
            "--record-token-ids), so its requests cannot be replayed; replay its trace instead"
        )
    block_size = run_config(run)["block_size"]
    rows = run.rows(_REQUESTS_SQL)
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


_RUN_STREAM_SQL = """
WITH arrivals AS (
    SELECT request_id, min(seq) AS arrive_seq,
        arg_min(coalesce(engine_id, ''), seq) AS engine_id,
        arg_min(coalesce(dp_rank, 0), seq) AS dp_rank
    FROM events WHERE kind = 'arrive' GROUP BY ALL
),
blocks AS (
    SELECT request_id, block_position, arg_min(block_hash, seq) AS block_hash
    FROM events
    WHERE kind IN ('hit', 'store') AND request_id IS NOT NULL
    GROUP BY ALL
),
chains AS (
    SELECT request_id,
        list(block_position ORDER BY block_position) AS positions,
        list(block_hash ORDER BY block_position) AS hashes
    FROM blocks
    GROUP BY request_id
)
SELECT requests.num_prompt_tokens, coalesce(requests.num_output_tokens, 0),
    chains.positions, chains.hashes, arrivals.engine_id, arrivals.dp_rank
FROM requests
JOIN arrivals USING (request_id)
LEFT JOIN chains USING (request_id)
WHERE requests.num_prompt_tokens IS NOT NULL
ORDER BY arrivals.arrive_seq
"""


def run_block_stream(run: RunFile) -> tuple[int, list[RequestBlocks]]:
    """The stream of a run file, from the block hashes vLLM recorded; and its block size.

    Requests come in arrival order. A request's keys stop at the first block position the
    run never hit nor stored (none is missing in a complete run).
    """
    block_size, rows = _run_stream(run)
    return block_size, [request for _, request in rows]


def engine_block_streams(run: RunFile) -> tuple[int, dict[Engine, list[RequestBlocks]]]:
    """Each engine's stream of a run file (one pool each), its requests in its own arrival
    order; and the block size. A single-engine run has one stream, `run_block_stream`'s."""
    block_size, rows = _run_stream(run)
    streams: dict[Engine, list[RequestBlocks]] = {}
    for engine, request in rows:
        streams.setdefault(engine, []).append(request)
    return block_size, streams


def _run_stream(run: RunFile) -> tuple[int, list[tuple[Engine, RequestBlocks]]]:
    block_size = run_config(run)["block_size"]
    stream = []
    for num_prompt, num_output, positions, hashes, engine_id, dp_rank in run.rows(_RUN_STREAM_SQL):
        keys: list[Hashable] = []
        for expected, (position, block_hash) in enumerate(
            zip(positions or (), hashes or (), strict=True)
        ):
            if position != expected:
                break
            keys.append(block_hash)
        num_tokens = num_kv_tokens(num_prompt, num_output)
        num_blocks = max(-(-num_tokens // block_size), len(keys))
        stream.append(((engine_id, dp_rank), RequestBlocks(tuple(keys), num_prompt, num_blocks)))
    return block_size, stream


def request_engines(run: RunFile) -> dict[str, Engine]:
    """The engine each request arrived at (engine id, '' when unnamed, and DP rank)."""
    rows = run.rows(
        """
        SELECT request_id, arg_min(coalesce(engine_id, ''), seq), arg_min(coalesce(dp_rank, 0), seq)
        FROM events WHERE kind = 'arrive' AND request_id IS NOT NULL GROUP BY ALL
        """
    )
    return {request_id: (engine_id, dp_rank) for request_id, engine_id, dp_rank in rows}


def mean_hit_tokens(run: RunFile, request_ids: list[str]) -> float:
    """Average prefix-hit tokens of the given requests (at their first admission)."""
    row = run.row(
        "SELECT avg(num_hit_tokens) FROM requests WHERE list_contains($ids, request_id)",
        {"ids": request_ids},
    )
    return 0.0 if row is None or row[0] is None else float(row[0])


def first_block_references(run: RunFile) -> pd.DataFrame:
    """Every use of a request's first block, in order: hit or store, when, which hash."""
    return run.frame(
        """
        SELECT events.request_id, events.kind::VARCHAR AS kind, events.ts_ns, events.block_hash,
            requests.num_hit_tokens, requests.tenant
        FROM events JOIN requests USING (request_id)
        WHERE events.kind IN ('hit', 'store') AND events.block_position = 0
        ORDER BY events.seq
        """
    )
