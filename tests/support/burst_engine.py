"""A burst through a real vLLM engine on this CPU: every request added before its first step
(the engine core in-process, so none arrives while it steps), each request's
`num_cached_tokens` and output tokens written beside its prompt as a kvscope trace; and timed
arrivals through a real OpenAI server, its step cost measured first (`kvscope calibrate`)."""

from __future__ import annotations

import json
import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from collector.live.step_cost import CompletionsClient, Measurements, measure
from collector.model.step_model import StepModel
from collector.replay.block_manager import CacheSettings
from collector.replay.replayer import ReplayOptions, replay
from collector.store.run_file import RunFile
from tests.support.repo import SECRET
from tests.support.vllm_server import TOKEN_RANGE, VllmServer, engine_environment, vllm_python

BURST_BLOCK_SIZE = 32
BURST_NUM_BLOCKS = 48
BURST_MAX_NUM_SEQS = 8
BURST_MAX_NUM_BATCHED_TOKENS = 256

ENGINE = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

if __name__ == "__main__":
    model, path, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    rows = [json.loads(line) for line in open(path)]
    llm = LLM(model=model, skip_tokenizer_init=True, enable_prefix_caching=True,
              max_model_len=1024, enforce_eager=True, **settings)
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=row["token_ids"]) for row in rows],
        [SamplingParams(max_tokens=row["output_length"], ignore_eos=True, temperature=0,
                        detokenize=False) for row in rows],
    )
    with open(path, "w") as handle:
        for row, output in zip(rows, outputs):
            row["engine_cached_tokens"] = output.num_cached_tokens or 0
            row["output_token_ids"] = list(output.outputs[0].token_ids)
            handle.write(json.dumps(row) + "\\n")
"""


def burst_rows(seed: int, count: int) -> list[dict[str, Any]]:
    """`count` requests at t=0 on six shared system prompts of 60 to 300 tokens, each with a
    question of its own (5 to 200 tokens) and 1 to 60 output tokens."""
    rng = random.Random(seed)
    systems = [
        [rng.randrange(*TOKEN_RANGE) for _ in range(rng.randrange(60, 300))] for _ in range(6)
    ]
    rows = []
    for index in range(count):
        question = [rng.randrange(*TOKEN_RANGE) for _ in range(rng.randrange(5, 200))]
        rows.append(
            {
                "request_id": f"r{index}",
                "timestamp": 0,
                "token_ids": systems[rng.randrange(6)] + question,
                "output_length": rng.randrange(1, 60),
            }
        )
    return rows


def run_burst(model: str, rows: list[dict[str, Any]], trace: Path) -> list[dict[str, Any]]:
    """Send `rows` to a real engine at once; returns them with the engine's figures, and
    leaves them in `trace`."""
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings = {
        "block_size": BURST_BLOCK_SIZE,
        "num_gpu_blocks_override": BURST_NUM_BLOCKS,
        "max_num_seqs": BURST_MAX_NUM_SEQS,
        "max_num_batched_tokens": BURST_MAX_NUM_BATCHED_TOKENS,
    }
    subprocess.run(
        [str(vllm_python()), "-c", ENGINE, model, str(trace), json.dumps(settings)],
        check=True,
        timeout=600,
        env=engine_environment(VLLM_ENABLE_V1_MULTIPROCESSING="0"),
        capture_output=True,
    )
    return [json.loads(line) for line in trace.read_text().splitlines()]


def run_timed(
    model: str, rows: list[dict[str, Any]], log: Path
) -> tuple[dict[str, int], Measurements]:
    """Start a real OpenAI server with the burst's settings, measure its step cost as
    `kvscope calibrate` does, then send each row at its timestamp (ms after the first);
    returns each request's cached tokens and the measurements."""
    args = ["--max-num-seqs", str(BURST_MAX_NUM_SEQS)]
    args += ["--max-num-batched-tokens", str(BURST_MAX_NUM_BATCHED_TOKENS)]
    server = VllmServer(model, log, args, engine_environment(), num_blocks=BURST_NUM_BLOCKS)
    try:
        server.wait_until_up()
        measured = measure(
            CompletionsClient(server.url("")), [16, 64, 128, 192, 250], [1, 4, 8], repeats=3
        )
        start = time.monotonic()

        def send(row: dict[str, Any]) -> tuple[str, int]:
            time.sleep(max(0.0, start + row["timestamp"] / 1000 - time.monotonic()))
            completion = server.complete(row["token_ids"], row["output_length"])
            return row["request_id"], completion.cached_tokens

        with ThreadPoolExecutor(len(rows)) as pool:
            return dict(pool.map(send, rows)), measured
    finally:
        server.stop()


def replayed_hits(
    trace: Path, out: Path, timing: str, step_model: StepModel | None = None
) -> dict[str, int]:
    """Each request's prefix-hit tokens in a replay of `trace` with the burst's settings (and
    the replay's default step cost, or `step_model`)."""
    options = ReplayOptions(
        settings=CacheSettings(BURST_BLOCK_SIZE, BURST_NUM_BLOCKS),
        timing=timing,
        max_num_seqs=BURST_MAX_NUM_SEQS,
        max_num_batched_tokens=BURST_MAX_NUM_BATCHED_TOKENS,
        step_model=step_model or StepModel(),
    )
    replay(trace, out, options, SECRET)
    with RunFile.open(out) as run:
        return dict(run.rows("SELECT request_id, num_hit_tokens FROM requests"))


def agreement(
    name: str, engine: dict[str, int], replayed: dict[str, int], prompt_tokens: int
) -> str:
    """One line: the replay's token hit ratio against the engine's, how many requests hit
    exactly what the engine reports, and every request that differs."""
    differ = {rid: (engine[rid], replayed[rid]) for rid in engine if replayed[rid] != engine[rid]}
    return (
        f"{name}: token hit ratio {sum(replayed.values()) / prompt_tokens:.4f} against the "
        f"engine's {sum(engine.values()) / prompt_tokens:.4f}; {len(engine) - len(differ)} of "
        f"{len(engine)} requests agree; differ (engine, replay): {json.dumps(differ)}"
    )
