"""`kvscope calibrate`: measure a running vLLM server's step cost for the replay's clock."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from collector.commands.number_list import number_list
from collector.live.step_cost import CompletionsClient, fit_step_model, measure
from collector.replay.scheduler_replay import DEFAULT_MAX_NUM_BATCHED_TOKENS


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "calibrate",
        help="measure a running vLLM server's step cost (--step-ms and the per-token times "
        "that replay and whatif take)",
        description="Probes an idle vLLM OpenAI server with random prompts (they never hit "
        "the prefix cache, but they take cache space) and fits the replay's step cost.",
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    parser.add_argument("--model", help="the served model's name (default: the first listed)")
    parser.add_argument(
        "--prompt-tokens",
        type=lambda text: number_list(int, text),
        default=[64, 256, 512, 1024, 2048],
        help="prompt lengths of the prefill probes, a comma-separated list "
        "(64,256,512,1024,2048); each must fit the server's --max-model-len",
    )
    parser.add_argument(
        "--batch-sizes",
        type=lambda text: number_list(int, text),
        default=[1, 4, 8],
        help="requests decoding at once in the decode probes (1,4,8); at most the server's "
        "--max-num-seqs",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        help=f"the server's own ({DEFAULT_MAX_NUM_BATCHED_TOKENS}): a longer prompt's prefill "
        "takes several steps",
    )
    parser.add_argument("--decode-tokens", type=int, default=32, help="decode steps a probe times")
    parser.add_argument("--repeats", type=int, default=3, help="tries per probe (the median)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.set_defaults(handler=_run_calibrate)


def _run_calibrate(args: argparse.Namespace) -> int:
    for name in ("max_num_batched_tokens", "decode_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    client = CompletionsClient(args.url, args.model)
    measured = measure(
        client,
        args.prompt_tokens,
        args.batch_sizes,
        decode_tokens=args.decode_tokens,
        repeats=args.repeats,
    )
    model = fit_step_model(measured, args.max_num_batched_tokens)
    flags = (
        f"--step-ms {model.step_ms:g} --prefill-us-per-token {model.prefill_us_per_token:g} "
        f"--decode-us-per-token {model.decode_us_per_token:g}"
    )
    if args.json:
        print(json.dumps({"model": client.model, "step_model": asdict(model), "flags": flags}))
        return 0
    print(f"{client.model} at {args.url}")
    for length, latency in measured.prefill_s.items():
        print(f"  prefill {length:>6,} tokens: {latency * 1e3:8.2f} ms (one request, 1 token out)")
    for batch, step in measured.decode_step_s.items():
        print(f"  decode step of {batch:>3} requests: {step * 1e3:8.3f} ms")
    print(f"\nreplay and whatif with: {flags}")
    return 0
