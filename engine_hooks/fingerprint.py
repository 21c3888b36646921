"""Independent strong fingerprints of block contents, for catching wrong prefix reuse.

A block's fingerprint is BLAKE2b-128 over its parent's fingerprint, its token ids and its
extra keys (what vLLM mixes into its own hash: LoRA, multimodal inputs, cache salt, prompt
embeddings, computed by vLLM's own `generate_block_hash_extra_keys`). Two blocks with the
same fingerprint hold the same prefix; a prefix hit whose cached block carries another
fingerprint than the request's own is a collision: another prompt's KV served for this one.

Kept per running request (its chain) and per cached block (the fingerprint it was stored
with, and by whom): dicts keyed by block id hold cached blocks only, so a whole list of
blocks is read or updated in C (map, filter, zip, update).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, Iterator
from itertools import repeat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.v1.request import Request

FINGERPRINT_BYTES = 16
_ROOT = b"\x00" * FINGERPRINT_BYTES


class BlockFingerprints:
    """Per running request, the fingerprint chain of its blocks, computed as far as needed;
    per cached block, the fingerprint it was stored with."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._chains: dict[str, list[bytes]] = {}
        self._stored: dict[int, bytes] = {}
        self._stored_by: dict[int, str] = {}

    def chain(self, request: Request, num_blocks: int) -> list[bytes]:
        """The fingerprints of the request's first `num_blocks` blocks (cached per request)."""
        from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        chain = self._chains.setdefault(request.request_id, [])
        if len(chain) >= num_blocks:
            return chain
        token_ids = request.all_token_ids
        block_size = self.block_size
        parent = chain[-1] if chain else _ROOT
        for position in range(len(chain), num_blocks):
            start = position * block_size
            # Index 0: vLLM's helper skips multimodal inputs that end before the block.
            extra_keys, _ = generate_block_hash_extra_keys(request, start, start + block_size, 0)
            digest = hashlib.blake2b(parent, digest_size=FINGERPRINT_BYTES)
            digest.update(array("q", token_ids[start : start + block_size]).tobytes())
            if extra_keys is not None:
                digest.update(repr(extra_keys).encode())
            parent = digest.digest()
            chain.append(parent)
        return chain

    def mismatches(
        self, request: Request, block_ids: list[int], first_position: int = 0
    ) -> Iterator[tuple[int, bytes, str | None, bytes]]:
        """For each hit block (at positions `first_position`.. of the request) whose stored
        fingerprint is not the request's own: its index in `block_ids`, the stored
        fingerprint, who stored it, and the request's own."""
        expected = self.chain(request, first_position + len(block_ids))
        for index, block_id in enumerate(block_ids):
            stored = self._stored.get(block_id)
            own = expected[first_position + index]
            if stored is not None and stored != own:
                yield index, stored, self._stored_by.get(block_id), own

    def forget(self, request_id: str) -> None:
        """Drop a request's chain (it finished or was preempted)."""
        self._chains.pop(request_id, None)

    def store(self, block_ids: list[int], fingerprints: Iterable[bytes], stored_by: str) -> None:
        """Blocks just cached, with their fingerprints and the request that stored them."""
        self._stored.update(zip(block_ids, fingerprints, strict=True))
        self._stored_by.update(zip(block_ids, repeat(stored_by), strict=False))

    def uncache(self, block_ids: Iterable[int]) -> None:
        """Blocks that lost their cached content (handed out again, or evicted)."""
        for block_id in filter(self._stored.__contains__, block_ids):
            del self._stored[block_id]
            del self._stored_by[block_id]

    def clear(self) -> None:
        """vLLM reset its prefix cache."""
        self._stored.clear()
        self._stored_by.clear()
