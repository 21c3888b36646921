"""A replay's CPU tier, recorded as vLLM's offloading connector publishes it: KV events of
medium "CPU" (BlockStored as the tier takes blocks, BlockRemoved as it drops them), in the
run file's vllm_kv_* tables, where a live engine's own KV events land. So the pages read a
tier's occupancy the same way from a replay and from a live engine."""

from __future__ import annotations

from collections.abc import Sequence

from collector.store.run_file import RunStore
from collector.vllm_kv.conflicts import HashConflictDetector
from collector.vllm_kv.ingest import append_vllm_batches
from collector.vllm_kv.wire import BlockRemoved, BlockStored, KVEventBatch, ReceivedBatch, WireEvent

ENDPOINT = "replay:cpu-tier"
MEDIUM = "CPU"  # vLLM's MEDIUM_CPU


class TierEvents:
    """Appends one batch per replay step that moved anything in the tier."""

    def __init__(self, store: RunStore, block_size: int) -> None:
        self._store = store
        self._block_size = block_size
        self._detector = HashConflictDetector()
        self._seq = 0

    def __call__(self, now_ns: int, moves: list[tuple[bool, list[bytes]]]) -> None:
        """Record (removed, block hashes) moves of the step that ended at `now_ns`."""
        self.append(
            now_ns,
            [
                BlockRemoved(block_hashes=list(hashes), medium=MEDIUM)
                if removed
                else BlockStored(
                    block_hashes=list(hashes), block_size=self._block_size, medium=MEDIUM
                )
                for removed, hashes in moves
            ],
        )

    def append(self, now_ns: int, events: Sequence[WireEvent]) -> None:
        """Record the tier's KV events of the step that ended at `now_ns`."""
        if not events:
            return
        batch = KVEventBatch(ts=now_ns / 1e9, events=list(events), data_parallel_rank=0)
        received = ReceivedBatch(ENDPOINT, epoch=0, seq=self._seq, batch=batch, replayed=False)
        append_vllm_batches(self._store, [received], [], self._detector)
        self._seq += 1
