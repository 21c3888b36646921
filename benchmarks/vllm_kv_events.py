"""Can kvscope's collector keep up with vLLM's own KV events? Both sides, measured in one run.

Engine side: the Mooncake synthetic trace (sequential timing) through vLLM's real
`KVCacheManager` with KV events on; after each step its events are taken and encoded as vLLM's
`ZmqEventPublisher` does (msgpack of a `KVEventBatch`). Collector side: each payload decoded
(kvscope's own schema), checked for 64-bit hash conflicts, and appended to a fresh run file
(Arrow, one DuckDB transaction per 100 batches, as a collector draining a poll would).
The socket in between is vLLM's and is not timed. Prints CPU seconds (process time) of each
side, their ratio per round, and the collector's cost per stored or removed block.

    python benchmarks/vllm_kv_events.py [--limit 3000] [--block-size 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import msgspec
from replay_args import add_replay_arguments
from vllm.distributed.kv_events import KVEventBatch

from collector.model.trace_request import TraceRequest
from collector.replay.block_manager import (
    CacheSettings,
    make_block_hasher,
    make_kv_cache_manager,
    require_vllm,
)
from collector.replay.simulator import Simulator, VirtualClock
from collector.replay.traces import read_trace
from collector.store.run_file import RunConfig, RunStore
from collector.vllm_kv.conflicts import HashConflictDetector
from collector.vllm_kv.ingest import append_vllm_batches
from collector.vllm_kv.wire import ReceivedBatch, decode_batch

BATCHES_PER_APPEND = 100


def engine_side(requests: list[TraceRequest], settings: CacheSettings) -> tuple[float, list[bytes]]:
    """Replay with KV events on; returns CPU seconds and the payloads vLLM would publish."""
    manager = make_kv_cache_manager(settings, kv_events=True)
    clock = VirtualClock()
    encoder = msgspec.msgpack.Encoder()
    payloads: list[bytes] = []

    def publish() -> None:
        events = manager.take_events()
        if events:
            batch = KVEventBatch(ts=clock() / 1e9, events=events, data_parallel_rank=0)
            payloads.append(encoder.encode(batch))

    simulator = Simulator(manager, None, clock, make_block_hasher(settings), on_step=publish)
    start = time.process_time()
    simulator.run_sequential(requests, lambda _: None)
    return time.process_time() - start, payloads


def collector_side(payloads: list[bytes], settings: CacheSettings) -> tuple[float, int]:
    """Decode, check and store every payload; returns CPU seconds and block rows stored."""
    with tempfile.TemporaryDirectory() as directory:
        config = RunConfig(
            "vllm-kv-events", settings.block_size, settings.num_blocks, "sha256", require_vllm()
        )
        store = RunStore.create(Path(directory) / "run.duckdb", config)
        detector = HashConflictDetector()
        start = time.process_time()
        for first in range(0, len(payloads), BATCHES_PER_APPEND):
            batches = [
                ReceivedBatch("bench", 0, seq, decode_batch(payloads[seq]), replayed=False)
                for seq in range(first, min(first + BATCHES_PER_APPEND, len(payloads)))
            ]
            append_vllm_batches(store, batches, [], detector)
        elapsed = time.process_time() - start
        row = store.row("SELECT count(*) FILTER (WHERE kind != 'cleared') FROM vllm_kv_events")
        store.close()
    return elapsed, int(row[0]) if row else 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_replay_arguments(parser, limit=3_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    requests = read_trace(args.trace)[: args.limit]
    settings = CacheSettings(args.block_size, args.num_blocks)
    print(f"{len(requests)} requests, block size {args.block_size}, {args.num_blocks} blocks")
    ratios, per_block_us = [], []
    for round_number in range(args.rounds):
        engine_s, payloads = engine_side(requests, settings)
        collector_s, blocks = collector_side(payloads, settings)
        ratios.append(collector_s / engine_s)
        per_block_us.append(collector_s / blocks * 1e6)
        print(
            f"  round {round_number + 1}: engine {engine_s:6.2f} s, collector {collector_s:6.2f} s "
            f"for {len(payloads):,} batches, {blocks:,} blocks stored or removed"
        )
    print(
        f"collector / engine CPU time: median {statistics.median(ratios):.3f} "
        f"({' '.join(f'{ratio:.3f}' for ratio in ratios)}); "
        f"collector {statistics.median(per_block_us):.1f} us per block"
    )


if __name__ == "__main__":
    main()
