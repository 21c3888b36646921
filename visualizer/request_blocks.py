"""One request's prompt as the Requests page shows it: each lookup cut into segments in
prompt order (the hit, the offload tier's, the group cut, every missed full block with its
own cause, the partial tail), and each cause's details in words.

The segments come from `lookup_causes` (a lookup's tokens per cause) and
`request_block_causes` (its missed full blocks, one by one): a cause's tokens that are no
full block of the second (the hit, the tier's, a group cut, a part block) are one segment
each, so every lookup's segments add up to its tokens per cause exactly.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd

from collector.queries.miss_causes import UNEXPLAINED_REASONS

NS_PER_MS = 1_000_000
LEADING = ("hit", "tier", "group_cut")  # the causes of a lookup's first tokens, in order


def numbered(causes: pd.DataFrame, blocks: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One request's `lookup_causes` and `request_block_causes` rows with each lookup's `seq`
    made its number among the request's lookups, earliest first. A record number is its
    engine's own: the lookups of a request sent to two engines (a retry under the same
    request id, or again to an engine restarted) may have the same one."""
    keys = ["engine", "rank", "seq"]
    order = causes.drop_duplicates(keys).sort_values(["ts_ns", *keys], kind="stable")[keys]
    order = order.assign(number=range(len(order)))

    def renumbered(frame: pd.DataFrame) -> pd.DataFrame:
        joined = frame.merge(order, on=keys, how="left", sort=False)
        return joined.assign(seq=joined["number"]).drop(columns="number")

    return renumbered(causes).sort_values("seq", kind="stable"), renumbered(blocks)


def lookup_names(causes: pd.DataFrame) -> dict[int, str]:
    """Each lookup (`seq`, as `numbered` makes it) of one request's `lookup_causes` rows in
    words: its first admission, or the admission after its n-th preemption; on which engine,
    where the request's lookups were on several."""
    names = {}
    resumed: Counter[tuple[str, int]] = Counter()
    firsts = causes.drop_duplicates("seq")
    several = len(firsts.drop_duplicates(["engine", "rank"])) > 1
    for lookup in firsts.to_dict("records"):
        engine = (str(lookup["engine"]), int(lookup["rank"]))
        resumed[engine] += bool(lookup["preempted"])
        name = f"after preemption {resumed[engine]}" if lookup["preempted"] else "first admission"
        where = f" on {engine[0]}" + (f" rank {engine[1]}" if engine[1] else "")
        names[int(lookup["seq"])] = name + (where if several else "")
    return names


def since(ago_ns: object) -> str:
    """A time before the lookup in ms under a second, else in s."""
    if ago_ns is None or pd.isna(ago_ns):  # type: ignore[call-overload]
        return "some time"
    ago = int(ago_ns)  # type: ignore[call-overload]
    return f"{ago / NS_PER_MS:,.0f} ms" if ago < 1_000 * NS_PER_MS else f"{ago / 1e9:,.1f} s"


def detail(row: dict[str, Any], tenants: dict[str, str | None]) -> str:
    """What a cause's row (a block of `request_block_causes`, or a lookup's row of
    `lookup_causes`) says about it, in words."""
    cause = row["cause"]
    if cause in ("evicted", "preempted", "cleared"):
        by = row.get("evicted_by")
        who = f" by {by} (tenant {tenants.get(by) or 'none'})" if isinstance(by, str) else ""
        where = f" on {row['evicted_on']}" if isinstance(row.get("evicted_on"), str) else ""
        what = {
            "evicted": "evicted",
            "preempted": "freed by this request's preemption, then evicted",
            "cleared": "removed by a cache reset",
        }[cause]
        return f"{what}{where} {since(row.get('evicted_ago_ns'))} before the lookup{who}"
    if cause == "key_mismatch":
        return f"the same tokens were cached under another key: {row.get('key_kind') or '?'}"
    if cause == "engine_stopped":
        return (
            f"cached on {row.get('evicted_on')} until that engine stopped, "
            f"{since(row.get('evicted_ago_ns'))} before the lookup"
        )
    if cause == "other_engine":
        return f"cached on {row.get('other_engine')} at the time of the lookup"
    if cause == "unexplained":
        reason = row.get("reason")
        return UNEXPLAINED_REASONS.get(reason, "") if isinstance(reason, str) else ""
    return {
        "cold": "no earlier request had these tokens at this position",
        "diverged": "an earlier prompt shared the prefix up to this block, then differed",
        "hit": "served from the prefix cache",
        "tier": "loaded from the offload tier",
        "group_cut": "one KV cache group held it, not every group",
        "partial_block": "the prompt's tail, which vLLM never serves from its cache",
    }.get(cause, "")


def segments(
    causes: pd.DataFrame, blocks: pd.DataFrame, block_size: int, tenants: dict[str, str | None]
) -> pd.DataFrame:
    """One request's lookups (`causes`: its `lookup_causes` rows) with their missed full
    blocks (`blocks`: its `request_block_causes`) as segments in prompt order: `lookup`
    (named), `seq`, `cause`, `start` and `tokens` (prompt tokens), `where` (block positions)
    and `detail`."""
    names = lookup_names(causes)
    records: list[dict[str, Any]] = [
        {str(key): value for key, value in row.items()} for row in causes.to_dict("records")
    ]
    missed: list[dict[str, Any]] = [
        {str(key): value for key, value in row.items()} for row in blocks.to_dict("records")
    ]
    rows = []
    for seq, name in names.items():
        lookup = [row for row in records if int(row["seq"]) == seq]
        own = [block for block in missed if int(block["seq"]) == seq]
        counted = Counter(block["cause"] for block in own)
        prompt_tokens = sum(int(row["tokens"]) for row in lookup)
        start = 0
        for row in sorted(lookup, key=_leading_first):
            rest = int(row["tokens"]) - block_size * counted[row["cause"]]
            if rest <= 0:
                continue
            tail = row["cause"] == "partial_block"
            at = prompt_tokens - rest if tail else start
            start += 0 if tail else rest
            rows.append(_segment(name, row, (at, rest), block_size, tenants))
        rows += [
            _segment(
                name, block, (int(block["position"]) * block_size, block_size), block_size, tenants
            )
            for block in own
        ]
    columns = ["lookup", "seq", "cause", "start", "tokens", "where", "detail"]
    return pd.DataFrame(rows, columns=columns).sort_values(["seq", "start"], kind="stable")


def _leading_first(row: dict[str, Any]) -> int:
    return LEADING.index(row["cause"]) if row["cause"] in LEADING else len(LEADING)


def _segment(
    lookup: str,
    row: dict[str, Any],
    span: tuple[int, int],
    block_size: int,
    tenants: dict[str, str | None],
) -> dict[str, object]:
    start, tokens = span
    first, last = start // block_size, (start + tokens - 1) // block_size
    return {
        "lookup": lookup,
        "seq": int(row["seq"]),
        "cause": row["cause"],
        "start": start,
        "tokens": tokens,
        "where": f"block {first}" if first == last else f"blocks {first}-{last}",
        "detail": detail(row, tenants),
    }


def merged(segments: pd.DataFrame, block_size: int) -> pd.DataFrame:
    """The `segments` with each run of neighbours alike (one lookup, one cause, the same
    details) as one row, in prompt order: a table's rows, where 37 blocks that diverged
    alike say so once."""
    rows: list[dict[str, Any]] = []
    for segment in segments.to_dict("records"):
        last = rows[-1] if rows else None
        alike = last is not None and all(
            last[column] == segment[column] for column in ("seq", "cause", "detail")
        )
        if last is not None and alike and last["start"] + last["tokens"] == segment["start"]:
            last["tokens"] += segment["tokens"]
        else:
            rows.append({str(key): value for key, value in segment.items()})
    for row in rows:
        first, end = row["start"] // block_size, (row["start"] + row["tokens"] - 1) // block_size
        row["where"] = f"block {first}" if first == end else f"blocks {first}-{end}"
    return pd.DataFrame(rows, columns=segments.columns)
