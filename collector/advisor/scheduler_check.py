"""Scheduler check: the cache-size rule's pools replayed through vLLM's own Scheduler.

The one-pass curve models one request at a time: exact for a run replayed that way, an
estimate for one whose requests overlapped. Such a run, when it recorded its prompts, is
replayed again through vLLM's Scheduler (`--timing scheduler`) at its own arrival times and
with its own scheduler settings, once per pool size asked; the replays' token hit ratios
replace the curve's. Each replay writes a run file into a temporary folder, removed after.
A fleet's requests are replayed engine by engine, each engine's own (as the run placed them)
through a Scheduler of its own: a fleet replayed through the Scheduler gives each engine what
its share gives alone (tests/test_fleet_replay.py), so the sums are the fleet's.
A run that is itself a replay through the Scheduler (with no CPU tier, which the check does
not replay) is not replayed again at its own pool size: a replay is deterministic, so the
run's own token hit ratio is what that replay would give (checked in
tests/test_advisor_scheduler_check.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from collector.advisor.context import RunContext
from collector.advisor.scheduler_ratios import SchedulerCheck
from collector.model.step_model import StepModel
from collector.queries.summary import hit_ratio
from collector.replay.block_manager import CacheSettings, VllmUnavailable, require_vllm
from collector.replay.replayer import ReplayOptions, replay_requests
from collector.store.run_file import StoreError

if TYPE_CHECKING:
    from collector.replay.replayer import ReplayOptions

# Two replays of 2 M prompt tokens (the sample run's requests four times over) take about
# 24 s here, vLLM's import (about 8 s, once) aside; a larger run is left to `kvscope whatif`.
MAX_PROMPT_TOKENS = 2_000_000
SECRET = b"kvscope-advisor"  # keys the replays' pseudonyms only: no ratio depends on it
NOT_CHECKED = "the curve's figures are not checked through vLLM's Scheduler"


def scheduler_check(context: RunContext, pool_sizes: tuple[int, ...]) -> SchedulerCheck:
    """The run's requests replayed through vLLM's Scheduler at `pool_sizes` (or why not),
    replayed once for every rule that asks (the context keeps the checks)."""
    if pool_sizes not in context.scheduler_checks:
        context.scheduler_checks[pool_sizes] = check_pools(context, pool_sizes)
    return context.scheduler_checks[pool_sizes]


def check_pools(context: RunContext, pool_sizes: tuple[int, ...]) -> SchedulerCheck:
    """Replay the run's requests through vLLM's Scheduler at each of `pool_sizes`."""
    skipped = reason_to_skip(context, needs_vllm=False)
    if skipped:
        return SchedulerCheck(skipped=skipped)
    cache = context.replay_cache
    kept = {size: cache.get(_replayed(context, size)) for size in dict.fromkeys(pool_sizes)}
    if any(ratio is None for ratio in kept.values()):
        skipped = reason_to_skip(context)  # vLLM, which replays what was not kept
        if skipped:
            return SchedulerCheck(skipped=skipped)
        context.note(
            f"replaying the run through vLLM's Scheduler at {len(kept)} pool sizes (kept for "
            "later advice on this run)"
        )
    try:
        ratios = {
            size: float(ratio) if ratio is not None else scheduler_ratio(context, size)
            for size, ratio in kept.items()
        }
    except (ValueError, StoreError) as error:  # a pool too small, settings vLLM refuses
        return SchedulerCheck(skipped=f"{NOT_CHECKED}: the replay failed ({error})")
    for size, ratio in ratios.items():
        cache.put(_replayed(context, size), ratio)
    return SchedulerCheck(ratios)


def _replayed(context: RunContext, num_blocks: int) -> str:
    """What a Scheduler check replays at `num_blocks`, for the replay cache."""
    return f"scheduler-check {context.num_engines} {replay_options(context, num_blocks)!r}"


def reason_to_skip(
    context: RunContext, max_prompt_tokens: int = MAX_PROMPT_TOKENS, *, needs_vllm: bool = True
) -> str:
    """Why the run's pools are not replayed through vLLM's Scheduler; "" when they are.
    `needs_vllm=False` leaves out whether vLLM is here (its import takes seconds): replays
    kept from an earlier advice need none."""
    if context.config["max_num_seqs"] == 1:
        return "the one-pass curve is exact for this run, which ran one request at a time"
    if not context.has_token_ids:
        return (
            f"{NOT_CHECKED}: the run did not record its prompts' token ids (replay with "
            "--record-token-ids, or run `kvscope whatif` on its trace)"
        )
    if context.prompt_tokens > max_prompt_tokens:
        return (
            f"{NOT_CHECKED}: the run has {context.prompt_tokens:,} prompt tokens, more than "
            f"the {max_prompt_tokens:,} the advisor replays (run `kvscope whatif RUN "
            "--timing scheduler` for its pool sizes)"
        )
    if not needs_vllm:
        return ""
    try:
        require_vllm()
    except VllmUnavailable:
        return f"{NOT_CHECKED}: this environment has no vLLM kvscope supports"
    return ""


def scheduler_ratio(context: RunContext, num_blocks: int) -> float:
    """The token hit ratio of the run's requests replayed through vLLM's Scheduler at their
    arrival times, with `num_blocks` and the run's other settings. On a fleet, each engine's
    own requests go through a Scheduler of their own (a pool of `num_blocks` each), as the
    run placed them; their hit and prompt tokens are summed."""
    if num_blocks == context.num_blocks and _replayed_so(context):
        return float(context.summary["token_hit_ratio"])
    requests = context.requests
    shares = context.engine_shares(requests) if context.num_engines > 1 else [requests]
    hit_tokens = prompt_tokens = 0
    with tempfile.TemporaryDirectory(prefix="kvscope-advisor-") as directory:
        for number, share in enumerate(shares):
            summary = replay_requests(
                share,
                context.path,
                Path(directory) / f"engine-{number}.duckdb",
                replay_options(context, num_blocks),
                SECRET,
            )
            hit_tokens += summary["hit_tokens"]
            prompt_tokens += summary["prompt_tokens"]
    return hit_ratio(hit_tokens, prompt_tokens)


def _replayed_so(context: RunContext) -> bool:
    """Whether the run is itself a replay of its requests through the Scheduler, with the
    settings the check replays with (no CPU tier)."""
    config = context.config
    return (
        config["source"] == "replay"
        and config["timing"] == "scheduler"
        and not context.options.cpu_tier
    )


def replay_options(context: RunContext, num_blocks: int) -> ReplayOptions:
    """The run's own cache and scheduler settings at `num_blocks`, in the Scheduler's timing;
    ReplayOptions' defaults for what the run did not record (a live capture records less)."""
    config, defaults, recorded = context.config, ReplayOptions(), context.options
    return ReplayOptions(
        settings=CacheSettings(
            config["block_size"],
            num_blocks,
            config["hash_algo"],
            recorded.kv_layout or defaults.settings.kv_layout,
        ),
        timing="scheduler",
        max_num_seqs=config["max_num_seqs"] or defaults.max_num_seqs,
        max_num_batched_tokens=recorded.max_num_batched_tokens or defaults.max_num_batched_tokens,
        max_loras=recorded.max_loras or defaults.max_loras,
        step_model=recorded.step_model or StepModel(),
    )
