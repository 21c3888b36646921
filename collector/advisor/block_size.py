"""Block size against the prompt-length distribution, with the sweep's evidence.

Only full blocks are cached, so the tokens after a prompt's last block boundary are never
reused (stranded), and a shared prefix is reused only up to the block boundary below its
end (hits lost at block boundaries). The sweep is the one-pass curve of the recorded prompts
at each candidate block size, compared at the same KV memory as the run's pool; what-if
replays at other block sizes (`kvscope whatif --kv-gib ...`) are shown beside it. On a fleet
the curves are each engine's own, summed (`RunContext.token_curve`), at each engine's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collector.advisor.context import RunContext
from collector.advisor.suggestion import Chart, Series, Suggestion, severity_for_gain

CANDIDATE_BLOCK_SIZES = (8, 16, 32, 64, 128)
MIN_GAIN = 0.01


def same_memory_blocks(context: RunContext, block_size: int) -> int:
    """The pool at `block_size` that takes the same memory as the run's pool."""
    usable_tokens = (context.num_blocks - 1) * context.block_size
    return usable_tokens // block_size + 1


@dataclass(frozen=True)
class SizeRatios:
    """A block size's token hit ratio at the run's KV memory and with no limit."""

    at_memory: float
    unlimited: float


def block_size_sweep(context: RunContext) -> dict[int, SizeRatios]:
    """Per candidate block size: token hit ratio at the run's memory and with no limit."""
    sweep = {}
    for block_size in sorted({*CANDIDATE_BLOCK_SIZES, context.block_size}):
        curve = context.token_curve(block_size)
        num_blocks = same_memory_blocks(context, block_size)
        if num_blocks < curve.min_num_blocks:
            continue  # a request would not fit in this memory at this block size
        sweep[block_size] = SizeRatios(
            curve.token_hit_ratio(num_blocks), curve.token_hit_ratio(1 << 40)
        )
    return sweep


def best_block_size(sweep: dict[int, SizeRatios], current: int) -> int:
    """The block size that hits most at the run's memory; ties go to the run's own, then to
    the larger one (fewer blocks to manage)."""
    return max(sweep, key=lambda size: (round(sweep[size].at_memory, 6), size == current, size))


def block_size(context: RunContext) -> list[Suggestion]:
    """Suggest the block size that hits most at the same memory, if it beats the run's."""
    sweep = block_size_sweep(context)
    current = context.block_size
    best = best_block_size(sweep, current)
    if best == current or sweep[best].at_memory - sweep[current].at_memory < MIN_GAIN:
        return []
    return [_suggestion(context, sweep, best)]


def _suggestion(context: RunContext, sweep: dict[int, SizeRatios], best: int) -> Suggestion:
    current = context.block_size
    gain = sweep[best].at_memory - sweep[current].at_memory
    gain_tokens = gain * context.prompt_tokens
    stranded = _stranded_tokens(context, current)
    finest = min(sweep)
    boundary_loss = sweep[finest].unlimited - sweep[current].unlimited
    return Suggestion(
        rule="block-size",
        title=f"Use block size {best} instead of {current}",
        severity=severity_for_gain(gain),
        evidence=[
            f"prompts end {stranded:.1f} tokens past their last block boundary on average: "
            f"those tokens are never cached (block size {current})",
            f"with an unlimited cache, block size {finest} hits {sweep[finest].unlimited:.1%} "
            f"of prompt tokens and {current} hits {sweep[current].unlimited:.1%}: "
            f"{boundary_loss * 100:.1f} points are lost at block boundaries",
            f"at the run's KV memory{context.per_engine}: "
            + ", ".join(
                f"{size}: {ratios.at_memory:.1%}" for size, ratios in sorted(sweep.items())
            ),
            *_replay_lines(context),
        ],
        effect=(
            f"token hit ratio {sweep[current].at_memory:.1%} -> {sweep[best].at_memory:.1%} at "
            f"the same KV memory (+{gain * 100:.1f} points, about {gain_tokens:,.0f} tokens "
            "over this run; one-pass curves of the recorded prompts)"
        ),
        action=(
            f"`--block-size {best}` (with `--num-gpu-blocks-override "
            f"{same_memory_blocks(context, best)}` for the same memory); check that your "
            "attention backend supports it (FlashAttention needs a multiple of 16)"
            + context.on_each_engine
        ),
        gain_tokens=gain_tokens,
        figures={
            "block_size": current,
            "recommended_block_size": best,
            "sweep": {str(size): ratios.at_memory for size, ratios in sweep.items()},
            "stranded_tokens_per_request": stranded,
            "boundary_loss": boundary_loss,
        },
        charts=[_sweep_chart(sweep, current)],
    )


def _stranded_tokens(context: RunContext, block_size: int) -> float:
    lengths = np.array([request.num_prompt_tokens for request in context.requests])
    return float((lengths % block_size).mean()) if lengths.size else 0.0


def _replay_lines(context: RunContext) -> list[str]:
    rows = sorted(context.whatif_rows, key=lambda row: (row.block_size, row.num_blocks))
    if not rows:
        return []
    return [
        "what-if replays through vLLM: "
        + ", ".join(
            f"block size {row.block_size} x {row.num_blocks:,} blocks: {row.token_hit_ratio:.1%}"
            for row in rows
        )
    ]


def _sweep_chart(sweep: dict[int, SizeRatios], current: int) -> Chart:
    sizes = sorted(sweep)
    return Chart(
        kind="bar",
        title=f"Token hit ratio by block size, at the run's KV memory (the run: {current})",
        x_title="block size (tokens)",
        y_title="token hit ratio",
        series=[
            Series(
                "same memory",
                [str(size) for size in sizes],
                [sweep[size].at_memory for size in sizes],
            ),
            Series(
                "unlimited cache",
                [str(size) for size in sizes],
                [sweep[size].unlimited for size in sizes],
            ),
        ],
    )
