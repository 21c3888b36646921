"""The what-if curves: token hit ratio against GiB of KV cache, one curve per block size.

The run's own block stream gives the curve at its block size; the recorded prompts (when the
run has them) give the other candidate block sizes; what-if replays through vLLM are points.
GiB on the x axis puts every block size on the same footing. On a fleet every curve is each
engine's own, summed at every pool size per engine, and a sweep counts only where it replayed
as many engines (`RunContext.whatif_rows`).
"""

from __future__ import annotations

from collector.advisor.block_size import CANDIDATE_BLOCK_SIZES
from collector.advisor.cache_size import recommend_size, smallest_pool_reaching
from collector.advisor.context import RunContext
from collector.advisor.suggestion import Chart, NotApplicable, Series
from collector.model.kv_memory import gib_for_blocks
from collector.model.mrc import MissRatioCurve


def _series(context: RunContext, name: str, curve: MissRatioCurve, max_gib: float) -> Series:
    sizes, ratios = curve.points()
    gib = [gib_for_blocks(context.spec, curve.block_size, int(size)) for size in sizes]
    kept = [index for index, value in enumerate(gib) if value <= max_gib]
    return Series(name, [gib[index] for index in kept], [float(ratios[index]) for index in kept])


def _timing(context: RunContext) -> str:
    if context.num_engines == 1:
        return "one request at a time"
    return f"{context.num_engines} engines, each one request at a time"


def whatif_curves(context: RunContext) -> Chart:
    """Every curve kvscope can draw for this run, up to where the run's curve saturates."""
    run_curve = context.curve
    top = run_curve.token_hit_ratio(len(run_curve.hit_blocks) + 1)
    widest = max(smallest_pool_reaching(run_curve, 0.99 * top), context.num_blocks) * 5 // 4
    max_gib = gib_for_blocks(context.spec, context.block_size, widest)
    series = [_series(context, f"block size {context.block_size} (this run)", run_curve, max_gib)]
    try:
        for block_size in CANDIDATE_BLOCK_SIZES:
            if block_size != context.block_size:
                curve = context.token_curve(block_size)
                series.append(_series(context, f"block size {block_size}", curve, max_gib))
    except NotApplicable:
        pass  # no recorded prompts: the run's own curve only
    rows = sorted(context.whatif_rows, key=lambda row: (row.block_size, row.num_blocks))
    for block_size in sorted({row.block_size for row in rows}):
        chosen = [row for row in rows if row.block_size == block_size]
        series.append(
            Series(
                f"what-if replays, block size {block_size}",
                [gib_for_blocks(context.spec, block_size, row.num_blocks) for row in chosen],
                [row.token_hit_ratio for row in chosen],
            )
        )
    current_gib = gib_for_blocks(context.spec, context.block_size, context.num_blocks)
    return Chart(
        kind="line",
        title=f"What-if: token hit ratio by KV cache size{context.per_engine} ({_timing(context)})",
        x_title=f"KV cache, GiB per GPU ({context.spec.name})",
        y_title="token hit ratio",
        series=series,
        markers={
            "this run": current_gib,
            "recommended": gib_for_blocks(
                context.spec, context.block_size, recommend_size(context).num_blocks
            ),
        },
    )
