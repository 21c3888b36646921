"""The replay options (cache settings, timing, trace format), shared by every command that
replays a trace: `kvscope replay` and `kvscope report`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from collector.model.step_model import StepModel
from collector.replay.block_manager import HASH_ALGOS, CacheSettings
from collector.replay.cpu_tier import TIER_POLICIES
from collector.replay.fleet import ROUTERS
from collector.replay.kv_layout import PRESETS
from collector.replay.replayer import TIMINGS, ReplayOptions
from collector.replay.scheduler_replay import DEFAULT_MAX_NUM_BATCHED_TOKENS
from collector.replay.traces import FORMATS

if TYPE_CHECKING:
    from collector.replay.replayer import ReplayOptions


def add_replay_options(parser: argparse.ArgumentParser) -> None:
    """Add --block-size, --num-blocks, --timing and the rest to a subcommand's parser."""
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block (16)")
    parser.add_argument(
        "--num-blocks",
        type=int,
        default=20_000,
        help="blocks in the pool, null block included (in each engine's, with --engines)",
    )
    parser.add_argument(
        "--hash-algo",
        choices=HASH_ALGOS,
        default="sha256",
        help="vLLM's --prefix-caching-hash-algo (sha256, vLLM's default)",
    )
    add_layout_option(parser, default="full")
    _add_timing_options(parser)
    add_format_option(parser)
    _add_recording_options(parser)
    add_tier_options(parser, many=False)
    add_fleet_options(parser)


def _add_timing_options(parser: argparse.ArgumentParser) -> None:
    """--timing, the scheduler's limits and the step's cost."""
    parser.add_argument(
        "--timing",
        choices=TIMINGS,
        default="scheduler",
        help="scheduler: at the trace's arrival times, through vLLM's own Scheduler (a trace "
        "without arrival times is one burst); sequential: one request at a time; timestamps: "
        "at the arrival times, batched by kvscope's older step model (scheduler)",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=256,
        help="running requests at most (timestamps, scheduler)",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        help=f"tokens a step schedules at most, vLLM's own (scheduler; "
        f"{DEFAULT_MAX_NUM_BATCHED_TOKENS})",
    )
    parser.add_argument(
        "--max-loras", type=int, default=1, help="adapters in one step, vLLM's (scheduler; 1)"
    )
    parser.add_argument(
        "--step-ms", type=float, default=10.0, help="step time (timestamps, scheduler)"
    )
    parser.add_argument(
        "--prefill-us-per-token",
        type=float,
        default=25.0,
        help="step time added per computed prompt token (timestamps, scheduler)",
    )
    parser.add_argument(
        "--decode-us-per-token",
        type=float,
        default=0.0,
        help="step time added per decoded token (scheduler)",
    )


def _add_recording_options(parser: argparse.ArgumentParser) -> None:
    """--limit, and what the run records."""
    parser.add_argument("--limit", type=int, help="replay only the first N requests")
    parser.add_argument(
        "--record-token-ids", action="store_true", help="store prompt token ids (private!)"
    )
    parser.add_argument(
        "--tokenizer",
        metavar="NAME",
        help="the tokenizer that made the trace's token ids, recorded in the run so the app "
        "shows its prompts as text: a tokenizer.json, a SentencePiece model, package:path "
        "or a model name (the sample's: mistral_common:data/tokenizer.model.v1)",
    )
    parser.add_argument(
        "--reveal-tenants",
        action="store_true",
        help="store tenant and LoRA adapter names, not pseudonyms",
    )
    parser.add_argument(
        "--check-collisions",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fingerprint every cached block: check each prefix hit against it, and store "
        "each block's key-free fingerprint (tells a key mismatch without token ids; on)",
    )


def add_fleet_options(parser: argparse.ArgumentParser) -> None:
    """--engines, --dp-size and --router: a fleet of engines (of DP ranks), each with its
    own pool, behind a router."""
    parser.add_argument(
        "--engines",
        type=int,
        default=1,
        help="replay across this many engines, each with its own pool of --num-blocks, behind "
        "--router; above 1 it takes --timing sequential or scheduler (1)",
    )
    parser.add_argument(
        "--router",
        choices=ROUTERS,
        default="round-robin",
        help="how a fleet routes a request at its arrival: round-robin; prefix-affinity (the "
        "engine caching the longest prefix of it, else the least loaded); least-loaded (the "
        "engine with the fewest requests: routed so far in the sequential timing, waiting and "
        "running in the scheduler's)",
    )
    parser.add_argument(
        "--dp-size",
        type=int,
        default=1,
        help="data-parallel ranks in each engine, each with its own pool of --num-blocks; the "
        "router picks the engine, vLLM's own DP load balancer the rank (1)",
    )


def add_tier_options(parser: argparse.ArgumentParser, many: bool) -> None:
    """--cpu-tier-blocks and --cpu-tier-policy: one each, or comma-separated lists (`many`,
    for a sweep)."""
    sweep = ", a comma-separated list to sweep" if many else ""
    parser.add_argument(
        "--cpu-tier-blocks",
        type=_block_counts if many else int,
        default=[0] if many else 0,
        help="a CPU offload tier behind the GPU pool, through vLLM's own offloading manager "
        f"(vLLM's --kv-offloading-size, in GPU-block-sized chunks; 0: none){sweep}",
    )
    parser.add_argument(
        "--cpu-tier-policy",
        type=_policies if many else str,
        choices=None if many else TIER_POLICIES,
        default=["lru"] if many else "lru",
        help=f"the tier's eviction policy, vLLM's own ({', '.join(TIER_POLICIES)}){sweep}",
    )


def _block_counts(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError as error:
        message = f"expected comma-separated counts, got {text!r}"
        raise argparse.ArgumentTypeError(message) from error
    if not values or any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected counts of 0 or more, got {text!r}")
    return values


def _policies(text: str) -> list[str]:
    values = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [value for value in values if value not in TIER_POLICIES]
    if not values or unknown:
        raise argparse.ArgumentTypeError(
            f"expected policies among {', '.join(TIER_POLICIES)}, got {text!r}"
        )
    return values


def add_format_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        dest="trace_format",
        help="the trace's format (auto: from its first line)",
    )


def add_layout_option(parser: argparse.ArgumentParser, default: str | None) -> None:
    parser.add_argument(
        "--kv-layout",
        default=default,
        help=f"the model's KV cache groups: a preset ({', '.join(PRESETS)}) or groups spelled "
        "out, e.g. full,sliding_window:128 (default: full)",
    )


def replay_options(args: argparse.Namespace) -> ReplayOptions:
    """The ReplayOptions the parsed arguments describe."""
    return ReplayOptions(
        settings=CacheSettings(args.block_size, args.num_blocks, args.hash_algo, args.kv_layout),
        timing=args.timing,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_loras=args.max_loras,
        step_model=StepModel(args.step_ms, args.prefill_us_per_token, args.decode_us_per_token),
        trace_format=args.trace_format,
        limit=args.limit,
        record_token_ids=args.record_token_ids,
        tokenizer=args.tokenizer,
        reveal_tenants=args.reveal_tenants,
        check_collisions=args.check_collisions,
        cpu_tier_blocks=args.cpu_tier_blocks,
        cpu_tier_policy=args.cpu_tier_policy,
        engines=args.engines,
        router=args.router,
        dp_size=args.dp_size,
    )
