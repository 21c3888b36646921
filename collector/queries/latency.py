"""Each request's queue time and time to first token, and their percentiles by how much of
its prompt the cache held (its hit share).

A live capture's figures are measured: the engine's own clock between a request's arrival at
the engine, its first scheduling and its first output token (engine_hooks/scheduler_hooks.py),
and for the TTFT from its arrival at vLLM's front end, the moment vLLM's own TTFT counts
from. A replay's are modelled: its virtual clock, a step's length from the step model, a first
token timed at the end of the step that gave it (collector/replay/scheduler_replay.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from collector.queries.config import run_config
from collector.store.run_file import RunFile

NS_PER_MS = 1e6

# Hit share buckets, in the order shown; a prompt whose uncached rest fits in one block is
# "all but the tail" (vLLM computes at least a prompt's last token).
BUCKETS = ("none cached", "under half", "half or more", "all but the tail")

_REQUESTS_SQL = """
SELECT
    requests.request_id,
    requests.tenant,
    requests.num_prompt_tokens,
    coalesce(requests.num_hit_tokens, 0) + coalesce(requests.num_tier_hit_tokens, 0)
        AS num_cached_tokens,
    requests.num_prefill_tokens,
    (requests.first_scheduled_ns - requests.arrival_ns) / 1e6 AS queue_ms,
    coalesce(requests.first_token_age_ns, requests.first_token_ns - requests.arrival_ns) / 1e6
        AS ttft_ms,
    CASE
        WHEN requests.num_prompt_tokens - num_cached_tokens <= runs.block_size
            AND num_cached_tokens > 0 THEN 'all but the tail'
        WHEN num_cached_tokens = 0 THEN 'none cached'
        WHEN 2 * num_cached_tokens < requests.num_prompt_tokens THEN 'under half'
        ELSE 'half or more'
    END AS hit_share
FROM requests, runs
WHERE requests.first_token_ns IS NOT NULL AND requests.num_prompt_tokens > 0
ORDER BY requests.arrival_ns, requests.request_id
"""


@dataclass(frozen=True)
class Latency:
    """A run's per-request latency (`requests`: one row each, with its hit share bucket) and
    its percentiles by bucket (`by_hit_share`); `clock` is "measured" (a live capture) or
    "modelled" (a replay)."""

    clock: str
    requests: pd.DataFrame
    by_hit_share: pd.DataFrame

    @property
    def empty(self) -> bool:
        return self.requests.empty


def request_latency(run: RunFile) -> Latency:
    """Every request with a first token: its queue time and TTFT in milliseconds, its cached
    and computed prompt tokens and its hit share bucket; and the percentiles by bucket."""
    clock = "measured" if run_config(run)["source"] == "engine" else "modelled"
    requests = run.frame(_REQUESTS_SQL)
    return Latency(clock, requests, percentiles_by_hit_share(requests))


def percentiles_by_hit_share(requests: pd.DataFrame) -> pd.DataFrame:
    """p50, p90 and p99 of TTFT and queue time per hit share bucket (the buckets with
    requests, in `BUCKETS` order), with each bucket's request count."""
    rows = []
    for bucket in BUCKETS:
        times = requests.loc[requests["hit_share"] == bucket, ["ttft_ms", "queue_ms"]].dropna()
        if times.empty:
            continue
        row: dict[str, object] = {"hit_share": bucket, "requests": len(times)}
        for column in ("ttft_ms", "queue_ms"):
            for q in (50, 90, 99):
                row[f"p{q}_{column}"] = float(times[column].quantile(q / 100))
        rows.append(row)
    columns = ["hit_share", "requests"] + [
        f"p{q}_{column}" for column in ("ttft_ms", "queue_ms") for q in (50, 90, 99)
    ]
    return pd.DataFrame(rows, columns=columns)


def latency_sentence(latency: Latency) -> str:
    """The p50 TTFT of the most cached bucket against full misses', in one sentence; "" when
    the run has no first tokens."""
    table = latency.by_hit_share.set_index("hit_share")["p50_ttft_ms"]
    if table.empty:
        return ""
    cached = [bucket for bucket in BUCKETS[1:] if bucket in table.index]
    parts = []
    if cached:
        best = cached[-1]
        parts.append(f"requests with {_phrase(best)}: p50 TTFT {_ms(float(table[best]))}")
    if "none cached" in table.index:
        miss = _ms(float(table["none cached"]))
        parts.append(f"against {miss} for full misses" if parts else f"full misses: p50 {miss}")
    return f"{latency.clock.capitalize()}: " + ", ".join(parts) + "."


def _phrase(bucket: str) -> str:
    return {
        "under half": "under half their prompt cached",
        "half or more": "half or more of their prompt cached",
        "all but the tail": "all but the tail of their prompt cached",
    }[bucket]


def _ms(value: float) -> str:
    return f"{value:,.1f} ms" if value < 10 else f"{value:,.0f} ms"


def latency_figures(latency: Latency) -> dict[str, object]:
    """The figures `kvscope summary --json` carries: the clock, the requests timed and the
    percentiles by hit share bucket (milliseconds, rounded to 0.01)."""
    table = latency.by_hit_share.round(2)
    return {
        "clock": latency.clock,
        "requests": len(latency.requests),
        "by_hit_share": table.to_dict(orient="records"),
    }


def request_times_ms(row: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """A `requests` row's queue time and TTFT in milliseconds, as `request_latency` counts
    them (None where the request was never scheduled, or gave no token)."""
    arrival = row["arrival_ns"]
    if arrival is None:
        return None, None
    scheduled, first_token, age = row["first_scheduled_ns"], row["first_token_ns"], None
    if first_token is not None:
        age = row["first_token_age_ns"]
        age = first_token - arrival if age is None else age
    queue = None if scheduled is None else (scheduled - arrival) / NS_PER_MS
    return queue, None if age is None else age / NS_PER_MS
