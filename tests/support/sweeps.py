"""What-if sweep results made by hand, for the advisor's tests (`kvscope whatif` makes them by
replaying: tests/test_whatif.py)."""

from __future__ import annotations

from collector.replay.sweep_results import SweepResult


def sweep_result(
    block_size: int,
    num_blocks: int,
    token_hit_ratio: float,
    *,
    engines: int = 1,
    router: str = "round-robin",
) -> SweepResult:
    """A point of a sweep: its pool, its fleet and the token hit ratio its replay measured;
    nothing else measured."""
    return SweepResult(
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_seqs=1,
        engines=engines,
        router=router,
        seconds=0.0,
        run=f"bs{block_size}-blocks{num_blocks}.duckdb",
        token_hit_ratio=token_hit_ratio,
        block_hit_ratio=0.0,
        hit_tokens=0,
        prompt_tokens=0,
        evictions=0,
        preemptions=0,
        requests=0,
        kv_gib=0.0,
    )
