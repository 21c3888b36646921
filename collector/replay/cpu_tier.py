"""A CPU offload tier behind the GPU pool: vLLM's own `CPUOffloadingManager` (the native
`--kv-offloading-backend`), called the way vLLM's offloading connector calls it.

Per request, one at a time: after the GPU prefix hits, the connector looks the next blocks up
in the tier one by one until a miss (those are loaded back instead of computed), and offers
the tier the prompt's full blocks from the first (vLLM's default offloads prompts only; the
tier stores those it does not hold, and keeps the offered ones from eviction while it makes
room). `tests/test_live_tiers.py` checks this against vLLM's own connector in its real
Scheduler. Loads and stores complete at once:
the transfer itself (the GPU worker's copy) is not modelled, only what is cached where. The
tier's policy is the manager's own: "lru" or "arc".
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from collector.replay.block_manager import require_vllm

TIER_POLICIES = ("lru", "arc")


@dataclass
class TierCounts:
    """What the tier did over a replay, in blocks."""

    hits: int = 0  # blocks loaded back from the tier
    stores: int = 0  # blocks written to the tier
    evictions: int = 0  # blocks the tier dropped for room


class CpuTier:
    """A tier of `num_blocks` GPU-block-sized chunks under vLLM's manager and `policy`."""

    def __init__(self, num_blocks: int, policy: str = "lru", events: bool = False) -> None:
        if policy not in TIER_POLICIES:
            raise ValueError(f"unknown tier policy {policy!r}; use one of {TIER_POLICIES}")
        if num_blocks < 1:
            raise ValueError(f"a CPU tier needs at least 1 block, got {num_blocks}")
        require_vllm()
        from vllm.v1.kv_offload.base import (  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
            LookupResult,
            ReqContext,
            get_offload_block_hash,
            make_offload_key,
        )
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        self._hit = LookupResult.HIT
        self._context = ReqContext
        self._offload_key = make_offload_key
        self._block_hash = get_offload_block_hash
        self.manager = CPUOffloadingManager(
            num_chunks=num_blocks, cache_policy=policy, enable_events=events
        )
        self.num_blocks = num_blocks
        self.policy = policy
        self.counts = TierCounts()
        self._request: Any = None

    def start(self, request_id: str) -> None:
        """A request arrives (the connector's `on_new_request`)."""
        self._request = self._context(req_id=request_id)
        self.manager.on_new_request(self._request)

    def lookup(self, keys: Sequence[Hashable]) -> int:
        """How many of `keys` (the blocks after the GPU hits, up to the hit limit) the tier
        holds from the first on (the connector's `get_num_new_matched_tokens`; changes
        nothing)."""
        found = 0
        for key in keys:
            if self.manager.lookup(self._key(key), self._request) is not self._hit:
                break
            found += 1
        return found

    def load(self, keys: Sequence[Hashable]) -> int:
        """Load back what `lookup` finds of `keys`; returns how many blocks."""
        found = self.lookup(keys)
        if found:
            loading = [self._key(key) for key in keys[:found]]
            self.manager.prepare_load(loading, self._request)
            self.manager.complete_load(loading, self._request)
            self.counts.hits += found
        return found

    def store(self, keys: Sequence[Hashable]) -> None:
        """Offer the tier the prompt's full blocks."""
        if not keys:
            return
        offload_keys = [self._key(key) for key in keys]
        output = self.manager.prepare_store(offload_keys, self._request)
        if output is None:  # no room that is not in use: vLLM skips the store
            return
        self.manager.complete_store(output.keys_to_store, self._request)
        self.counts.stores += len(output.keys_to_store)
        self.counts.evictions += len(output.evicted_keys)

    def finish(self) -> None:
        """The request is done (the connector's `on_request_finished`)."""
        self.manager.on_request_finished(self._request)
        self._request = None

    def take_events(self) -> list[tuple[bool, list[bytes]]]:
        """What the tier stored and dropped since the last call, as vLLM's offloading
        connector publishes it (with `events=True`): (removed, block hashes) in order."""
        return [
            (event.removed, [bytes(self._block_hash(key)) for key in event.keys])
            for event in self.manager.take_events()
        ]

    def _key(self, key: Hashable) -> Any:
        if isinstance(key, bytes):  # vLLM's block hash: the connector's own key
            return self._offload_key(key, 0)
        if isinstance(key, int):
            digest = key.to_bytes(16, "little", signed=True)
        else:
            digest = hashlib.blake2b(repr(key).encode(), digest_size=16).digest()
        return self._offload_key(digest, 0)
