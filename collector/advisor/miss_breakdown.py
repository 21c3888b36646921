"""The run's miss breakdown as the advisor quotes it: each rule that fixes a miss cause
quotes the tokens that cause lost, exactly as `kvscope explain` and the Overview's waterfall
give them (collector/queries/miss_causes.py), so the suggestions and the waterfall add up to
the same numbers.

Which rule quotes which cause: `per-request-salt` the key mismatches of another cache salt,
`lora-split` those of another LoRA adapter, `dynamic-field` the diverged tokens (and its
family's part of them), `cache-size` (growing) and `eviction-regret` the evicted tokens and
those preemption lost, `routing` the tokens cached on another engine, `hybrid-alignment`
the tokens cut short by another KV cache group. A rule quotes what the breakdown says, 0
tokens included: it does not decide whether the rule fires.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from collector.queries.miss_causes import CAUSE_NAMES, cause_totals, detail_totals
from collector.store.run_file import RunFile

KEY_KINDS = {
    "cache_salt": "another cache salt",
    "lora": "another LoRA adapter",
    "extra_keys": "another extra key (a multimodal input)",
}


@dataclass(frozen=True)
class CauseQuote:
    """The tokens one or more causes (or a key mismatch of one kind) lost over the run,
    each cause's `share` of the prompt tokens looked up as `cause_totals` gives it; `line`
    is the evidence line, `figures` what goes in the suggestion's figures."""

    tokens: dict[str, int]  # by cause, `key_mismatch:KIND` for a key kind
    shares: dict[str, float]
    line: str

    @property
    def total(self) -> int:
        return sum(self.tokens.values())

    @property
    def lines(self) -> list[str]:
        """The evidence line; none for a run without a breakdown."""
        return [self.line] if self.line else []

    @property
    def figures(self) -> dict[str, Any]:
        """`cause_tokens` and `cause_share`: the causes' tokens and share together;
        `miss_causes`: the tokens of each (nothing for a run without a breakdown)."""
        if not self.tokens:
            return {}
        return {
            "cause_tokens": self.total,
            "cause_share": sum(self.shares.values()),
            "miss_causes": dict(self.tokens),
        }


@dataclass(frozen=True)
class MissBreakdown:
    """A run's causes (`cause_totals`) and their details (`detail_totals`)."""

    totals: pd.DataFrame
    details: pd.DataFrame

    @property
    def looked_up(self) -> int:
        return int(self.totals["tokens"].sum())

    def tokens(self, cause: str, key_kind: str | None = None) -> int:
        """The tokens `cause` lost; of one kind of key only, with `key_kind`."""
        if key_kind is None:
            return int(self.totals.loc[self.totals["cause"] == cause, "tokens"].sum())
        rows = self.details[
            (self.details["cause"] == cause) & (self.details["key_kind"] == key_kind)
        ]
        return int(rows["tokens"].sum())

    def share(self, cause: str, key_kind: str | None = None) -> float:
        """As `cause_totals` gives it: the tokens over the prompt tokens looked up."""
        if key_kind is None:
            return float(self.totals.loc[self.totals["cause"] == cause, "share"].sum())
        return self.tokens(cause, key_kind) / self.looked_up if self.looked_up else 0.0

    def quote(self, *causes: str, key_kind: str | None = None) -> CauseQuote:
        """The evidence line quoting the tokens and share of each of `causes` (of a key
        mismatch of `key_kind` only, where given)."""
        keyed = {(f"{cause}:{key_kind}" if key_kind else cause): cause for cause in causes}
        tokens = {key: self.tokens(cause, key_kind) for key, cause in keyed.items()}
        shares = {key: self.share(cause, key_kind) for key, cause in keyed.items()}
        parts = [
            f"{tokens[key]:,} ({shares[key]:.1%}) {'as' if index else 'missed as'} "
            + _cause_name(cause, key_kind)
            for index, (key, cause) in enumerate(keyed.items())
        ]
        line = "the miss breakdown of the prompt tokens looked up (`kvscope explain`): " + (
            ", ".join(parts)
        )
        unseen = self.unexplained_keys()
        if key_kind and unseen:
            line += (
                f"; {unseen:,} more are unexplained: without token ids or key-free "
                "fingerprints a key mismatch cannot be told from a new prefix"
            )
        return CauseQuote(tokens, shares, line)

    def unexplained_keys(self) -> int:
        """Unexplained tokens that may hide key mismatches (reason `no_token_ids`)."""
        rows = self.details[
            (self.details["cause"] == "unexplained") & (self.details["reason"] == "no_token_ids")
        ]
        return int(rows["tokens"].sum())


NO_BREAKDOWN = CauseQuote({}, {}, "")


def quote_causes(
    breakdown: MissBreakdown | None, *causes: str, key_kind: str | None = None
) -> CauseQuote:
    """`breakdown.quote(...)`; nothing to quote for a run without lookups."""
    return NO_BREAKDOWN if breakdown is None else breakdown.quote(*causes, key_kind=key_kind)


def _cause_name(cause: str, key_kind: str | None) -> str:
    if cause == "key_mismatch" and key_kind:
        return f"the same tokens under {KEY_KINDS.get(key_kind, key_kind)}"
    return CAUSE_NAMES[cause]


def read_breakdown(run: RunFile) -> MissBreakdown | None:
    """The run's miss breakdown; None for a run without lookups (vLLM's KV events alone)."""
    breakdown = MissBreakdown(cause_totals(run), detail_totals(run))
    return breakdown if breakdown.looked_up else None
