"""Why each lookup missed: every prompt token of every lookup (a request's first admission,
and each admission after a preemption) split into the tokens served and the tokens missed,
and every missed token given exactly one cause.

A lookup of P prompt tokens with H tokens hit (vLLM's own count, `prefix_cache_hits`), T
more loaded by an offload tier, and a longest single-group hit of G (hybrid layouts), is cut
into segments, in prompt order:

- `hit`: the first H tokens, served from the GPU prefix cache;
- `tier`: the next T tokens, loaded by vLLM's KV connector (an offload tier);
- `group_cut` (cut short by another KV cache group): the tokens after those up to G, which
  one group had cached but not every group;
- the full blocks after that, each classified below (a block the tier or the group cut
  reached into part way counts its tokens past the boundary as `unexplained`);
- `partial_block`: the tail vLLM never serves from its cache, from the last full block
  before the final prompt token on: a block shorter than the block size, or the last full
  block when the prompt ends on a boundary (vLLM computes the final token again).

A missed full block at position p is known by the hash the request stored (or hit) there.
Its own state at the lookup, on the lookup's engine (its KV cache group: the run's
reference group):

- cached there, still: it could not be reached, because a block before it missed: it takes
  that block's cause (the first missed block cached is `unexplained`);
- cached on another engine of the run at the lookup's time: `other_engine` (a routing miss);
- cached there earlier, by a store that ended before the lookup: `evicted` (with the request
  whose allocation took it, its tenant, its prefix family and how long before the lookup);
  `preempted` when the store was this request's own and the lookup resumes it after a
  preemption; `cleared` when a cache reset ended it;
- cached on another engine earlier, no more: `evicted` (there), or `engine_stopped` when
  that engine stopped with it cached (its closing batch: a restarted engine starts empty);
- never cached anywhere before the lookup, a new hash. The first new block of a run of them
  is `key_mismatch` when an earlier request on the same engine cached the same tokens (the
  whole prefix up to this block) under another key: a cache salt, a LoRA adapter or another
  extra key (told by the key-free fingerprint the hooks send with each stored block, or
  from recorded token ids; across engines vLLM's hashes agree only under one hash seed, so
  only one engine's blocks are compared); else `diverged` when an earlier request had
  cached the same prefix up to this block and went on with other tokens; else `cold`
  (first sight). Each new block after it takes its cause: its hash is new because its
  parent's is.

What cannot be told is `unexplained`, never guessed: a block the request never stored or hit
(aborted, or its records dropped); the blocks that open a run of new hashes, on an engine
that had met extra keys (salts, adapters, multimodal inputs) before the lookup, when the
block has neither a key-free fingerprint (the fingerprints switched off) nor recorded token
ids: a key mismatch then looks like a cold block. A run of vLLM's KV events alone has no
lookups at all.

The run file holds the causes in its derived table `lookup_causes`
(collector/store/lookup_causes.py, which carries them from one live copy to the next).
"""

from __future__ import annotations

import pandas as pd

from collector.model.time_window import TimeWindow
from collector.store.lookup_causes import REQUEST_BLOCKS
from collector.store.run_file import RunFile

# The causes, in the order the waterfall and the tables show them.
CAUSES = (
    "hit",
    "tier",
    "group_cut",
    "cold",
    "diverged",
    "key_mismatch",
    "evicted",
    "preempted",
    "cleared",
    "engine_stopped",
    "other_engine",
    "partial_block",
    "unexplained",
)
CAUSE_NAMES = {
    "hit": "hit",
    "tier": "loaded from the offload tier",
    "group_cut": "cut short by another KV cache group",
    "cold": "cold (first sight)",
    "diverged": "diverged from a cached prefix",
    "key_mismatch": "same tokens, another key",
    "evicted": "evicted",
    "preempted": "own blocks lost to preemption",
    "cleared": "cleared by a cache reset",
    "engine_stopped": "lost when its engine stopped",
    "other_engine": "cached on another engine",
    "partial_block": "partial last block",
    "unexplained": "unexplained",
}
UNEXPLAINED_REASONS = {
    "never_stored": "the request never stored this block (aborted, or records dropped)",
    "no_token_ids": "neither token ids nor key-free fingerprints were recorded, and the engine "
    "had met extra keys: a key mismatch cannot be told from a cold or diverged block",
    "cached_at_lookup": "cached on this engine at the lookup, yet not hit",
    "unaligned": "a part block between the tier or group hit and the next block boundary",
}

_WINDOW = "($start IS NULL OR ts_ns >= $start) AND ($end IS NULL OR ts_ns < $end)"


def lookup_causes(
    run: RunFile, request: str | None = None, window: TimeWindow | None = None
) -> pd.DataFrame:
    """One row per lookup and cause (of one request's lookups with `request`, of the lookups
    in `window` with one), from the run's `lookup_causes` table: the lookup (`seq`,
    `engine`, `rank`, `request_id`, `ts_ns`, `preempted`), the `cause`, its `tokens`,
    `blocks` and first block position, the request's prefix `family`, and the details of
    the cause's first block: `reason` (unexplained), `key_kind`, `other_engine`,
    `evicted_on` (another engine), `evicted_by` (the request whose allocation evicted it,
    its tenant and its prefix family) and `evicted_ago_ns` (how long before the lookup)."""
    return run.frame(
        f"""SELECT * FROM lookup_causes
        WHERE ($request IS NULL OR request_id = $request) AND {_WINDOW}
        ORDER BY engine, rank, seq, first_position""",
        {
            "request": request,
            "start": None if window is None else window.start_ns,
            "end": None if window is None else window.end_ns,
        },
    )


def cause_totals(run: RunFile, window: TimeWindow | None = None) -> pd.DataFrame:
    """Per cause (every one of CAUSES, in their order, 0 where none): the `tokens` of the
    lookups (in `window`), their `share` of the prompt tokens looked up, and the `lookups`
    that lost tokens to it."""
    totals = run.frame(
        f"""SELECT cause, CAST(sum(tokens) AS BIGINT) AS tokens, count(*) AS lookups
        FROM lookup_causes WHERE {_WINDOW} GROUP BY cause""",
        _window(window),
    ).set_index("cause")
    totals = totals.reindex(list(CAUSES), fill_value=0).rename_axis("cause").reset_index()
    looked_up = int(totals["tokens"].sum())
    totals["share"] = totals["tokens"] / looked_up if looked_up else 0.0
    return totals


def detail_totals(run: RunFile, window: TimeWindow | None = None) -> pd.DataFrame:
    """The tokens of the lookups (in `window`) per `cause` and its details as each lookup's
    row gives them: `key_kind` (a key mismatch's) and `reason` (unexplained); a lookup's
    row takes the details of its first block. Each cause's rows sum to its `cause_totals`."""
    return run.frame(
        f"""SELECT cause, key_kind, reason, CAST(sum(tokens) AS BIGINT) AS tokens
        FROM lookup_causes WHERE {_WINDOW} GROUP BY ALL ORDER BY ALL""",
        _window(window),
    )


def requests_cause_tokens(run: RunFile, cause: str, request_ids: list[str]) -> int:
    """The tokens the lookups of the given requests lost to `cause`."""
    row = run.row(
        """SELECT CAST(coalesce(sum(tokens), 0) AS BIGINT) FROM lookup_causes
        WHERE cause = $cause AND list_contains($ids, request_id)""",
        {"cause": cause, "ids": request_ids},
    )
    return 0 if row is None else int(row[0])


def request_block_causes(run: RunFile, request: str) -> pd.DataFrame:
    """A request's missed full blocks, one row per lookup and block `position`, with the
    block's `state` at the lookup and its cause (and details) as in `lookup_causes`."""
    return run.frame(REQUEST_BLOCKS, {"request": request})


def family_losses(run: RunFile, window: TimeWindow | None = None) -> pd.DataFrame:
    """The prefix families (`family`: the first block hash of the reference group, NULL for
    a request that stored or hit none) and the tokens their lookups (in `window`) missed,
    per cause, with the `requests` that missed them and the family's missed tokens in all
    (`family_tokens`); the families that lost most first."""
    return run.frame(
        f"""SELECT *, CAST(sum(tokens) OVER (PARTITION BY family) AS BIGINT) AS family_tokens
        FROM (
            SELECT family, cause, CAST(sum(tokens) AS BIGINT) AS tokens,
                count(DISTINCT request_id) AS requests
            FROM lookup_causes
            WHERE cause NOT IN ('hit', 'tier') AND {_WINDOW}
            GROUP BY ALL
        )
        ORDER BY family_tokens DESC, family, tokens DESC""",
        _window(window),
    )


def _window(window: TimeWindow | None) -> dict[str, object]:
    return {
        "start": None if window is None else window.start_ns,
        "end": None if window is None else window.end_ns,
    }
