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
- cached on another engine earlier, no more: `evicted` (there);
- never cached anywhere before the lookup, a new hash. The first new block of a run of them
  is `key_mismatch` when an earlier request cached the same tokens (the whole prefix up to
  this block) under another key: a cache salt, a LoRA adapter or another extra key (told
  from recorded token ids); else `diverged` when an earlier request had cached the same
  prefix up to this block and went on with other tokens; else `cold` (first sight). Each new
  block after it takes its cause: its hash is new because its parent's is.

What cannot be told is `unexplained`, never guessed: a block the request never stored or hit
(aborted, or its records dropped); the new blocks of a run whose requests carry extra keys
(salts, adapters, multimodal inputs) when token ids were not recorded, since a key mismatch
then looks like a cold block. A run of vLLM's KV events alone has no lookups at all.
"""

from __future__ import annotations

import pandas as pd

from collector.model.time_window import TimeWindow
from collector.queries.missed_blocks import LOOKUP_CAUSES_SQL, WITH_BLOCKS
from collector.store.reference_group import IN_REFERENCE_GROUP
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
    "other_engine": "cached on another engine",
    "partial_block": "partial last block",
    "unexplained": "unexplained",
}
UNEXPLAINED_REASONS = {
    "never_stored": "the request never stored this block (aborted, or records dropped)",
    "no_token_ids": "token ids were not recorded, and the run has extra keys: a key mismatch "
    "cannot be told from a cold or diverged block",
    "cached_at_lookup": "cached on this engine at the lookup, yet not hit",
    "unaligned": "a part block between the tier or group hit and the next block boundary",
}

# A request's missed full blocks, one row each (`blocks` ends the WITH list with a comma).
_REQUEST_BLOCKS_SQL = (
    WITH_BLOCKS.rstrip().removesuffix(",")
    + " SELECT * EXCLUDE (bs) FROM blocks ORDER BY engine, rank, seq, position"
)


def _parameters(request: str | None = None, window: TimeWindow | None = None) -> dict[str, object]:
    return {
        "request": request,
        "start": None if window is None else window.start_ns,
        "end": None if window is None else window.end_ns,
    }


def lookup_causes(
    run: RunFile, request: str | None = None, window: TimeWindow | None = None
) -> pd.DataFrame:
    """One row per lookup and cause (of one request's lookups with `request`, of the lookups
    in `window` with one): the lookup (`seq`, `engine`, `rank`, `request_id`, `ts_ns`,
    `preempted`), the `cause`, its `tokens`, `blocks` and first block position, and its
    details (those of its first block): `reason` (unexplained), `key_kind`, `other_engine`,
    `evicted_on` (another engine), `evicted_by` (the request whose allocation evicted it,
    its tenant and its prefix family) and `evicted_ago_ns` (how long before the lookup)."""
    return run.frame(
        LOOKUP_CAUSES_SQL + " ORDER BY engine, rank, seq, first_position",
        _parameters(request, window),
    )


def cause_totals(run: RunFile, window: TimeWindow | None = None) -> pd.DataFrame:
    """Per cause (every one of CAUSES, in their order, 0 where none): the `tokens` of the
    lookups (in `window`), their `share` of the prompt tokens looked up, and the `lookups`
    that lost tokens to it."""
    causes = lookup_causes(run, window=window)
    totals = causes.groupby("cause").agg(tokens=("tokens", "sum"), lookups=("seq", "size"))
    totals = totals.reindex(list(CAUSES), fill_value=0).reset_index()
    looked_up = int(totals["tokens"].sum())
    totals["share"] = totals["tokens"] / looked_up if looked_up else 0.0
    return totals


def request_block_causes(run: RunFile, request: str) -> pd.DataFrame:
    """A request's missed full blocks, one row per lookup and block `position`, with the
    block's `state` at the lookup and its cause (and details) as in `lookup_causes`."""
    return run.frame(_REQUEST_BLOCKS_SQL, _parameters(request))


_FAMILY_LOSSES_SQL = f"""
WITH causes AS ({LOOKUP_CAUSES_SQL}),
roots AS (
    SELECT request_id, any_value(block_hash) AS family
    FROM events
    WHERE kind IN ('hit', 'store') AND block_position = 0 AND {IN_REFERENCE_GROUP}
    GROUP BY ALL
)
SELECT *, CAST(sum(tokens) OVER (PARTITION BY family) AS BIGINT) AS family_tokens
FROM (
    SELECT roots.family, causes.cause, CAST(sum(causes.tokens) AS BIGINT) AS tokens,
        count(DISTINCT causes.request_id) AS requests
    FROM causes
    LEFT JOIN roots USING (request_id)
    WHERE causes.cause NOT IN ('hit', 'tier')
    GROUP BY ALL
)
"""


def family_losses(run: RunFile, window: TimeWindow | None = None) -> pd.DataFrame:
    """The prefix families (`family`: the first block hash of the reference group, NULL for
    a request that stored or hit none) and the tokens their lookups (in `window`) missed,
    per cause, with the `requests` that missed them and the family's missed tokens in all
    (`family_tokens`); the families that lost most first."""
    return run.frame(
        _FAMILY_LOSSES_SQL + " ORDER BY family_tokens DESC, family, tokens DESC",
        _parameters(window=window),
    )
