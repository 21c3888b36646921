"""What a what-if sweep gives: each point's figures, and the sweep as `whatif.json` holds it.

Typed from the replay (collector/replay/sweep_point.py) through the sweep
(collector/replay/whatif.py) to the advisor (`RunContext.whatif_rows`); JSON only where
`whatif.json` is written and read, and where `kvscope whatif --json` prints. Defaults are
what a `whatif.json` written before a field existed replayed.
"""

from __future__ import annotations

from typing import Any

import msgspec

from collector.model.kv_memory import KVSpec, gib_for_blocks


class PointFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One replayed point: its settings (a `SweepPoint`'s, and the DP ranks of each engine),
    how long its replay took, its run file's name and what the replay measured."""

    block_size: int
    num_blocks: int
    max_num_seqs: int
    cpu_tier_blocks: int = 0
    cpu_tier_policy: str = "lru"
    engines: int = 1
    router: str = "round-robin"
    dp_size: int = 1
    seconds: float
    run: str
    token_hit_ratio: float
    block_hit_ratio: float
    hit_tokens: int
    prompt_tokens: int
    evictions: int
    preemptions: int
    requests: int
    tier_hit_tokens: int = 0
    tier_token_hit_ratio: float = 0.0

    @property
    def num_pools(self) -> int:
        """The point's KV cache pools: its engines times their DP ranks."""
        return self.engines * self.dp_size

    @property
    def order(self) -> tuple[int, int, int, int, str, int, str]:
        """Where the point sits in a sweep's results."""
        return (
            self.block_size,
            self.max_num_seqs,
            self.num_blocks,
            self.cpu_tier_blocks,
            self.cpu_tier_policy,
            self.engines,
            self.router,
        )


class SweepResult(PointFigures, frozen=True, kw_only=True):
    """A replayed point as `whatif.json` lists it: with the GiB of KV cache its pool takes
    under the sweep's KV spec."""

    kv_gib: float

    @classmethod
    def of(cls, figures: PointFigures, spec: KVSpec) -> SweepResult:
        """The point's figures, with the GiB its pool takes under `spec` (to 3 places)."""
        kv_gib = round(gib_for_blocks(spec, figures.block_size, figures.num_blocks), 3)
        return cls(**msgspec.structs.asdict(figures), kv_gib=kv_gib)

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON object (a `whatif.json` row, a line of `--json`)."""
        return msgspec.structs.asdict(self)


class WhatIfSweep(msgspec.Struct, frozen=True, kw_only=True):
    """A sweep as `whatif.json` holds it: its source, the replay options its points share,
    the KV spec its memory figures assume, and every point's result."""

    source: str
    timing: str
    hash_algo: str
    kv_layout: str = "full"  # what a sweep written before layouts replayed
    kv_spec: KVSpec
    results: list[SweepResult]

    def to_json(self) -> dict[str, Any]:
        """The sweep as the JSON document `whatif.json` holds."""
        return {
            "source": self.source,
            "timing": self.timing,
            "hash_algo": self.hash_algo,
            "kv_layout": self.kv_layout,
            "kv_spec": self.kv_spec.to_dict(),
            "results": [result.to_json() for result in self.results],
        }
