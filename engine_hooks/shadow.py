"""What the hooks know of vLLM's prefix cache, block by block (vLLM never reads it).

For every cached block: the hash it was stored under and, with the collision check, its
fingerprint and the request that stored it; plus how many cached blocks sit free
(evictable). When a block was stored and how often it was hit are in the records already
(the collector derives ages and hit counts), so the shadow keeps no clock or counter.
Dicts keyed by block id hold cached blocks only, so a whole list of blocks is read or
updated in C (map, filter, zip, update), with no Python loop per block on vLLM's hot path.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat


class CacheShadow:
    """The hooks' mirror of which blocks hold a prefix-cache hash."""

    def __init__(self) -> None:
        self.hashes: dict[int, bytes] = {}
        self._fingerprints: dict[int, bytes] = {}
        self._stored_by: dict[int, str] = {}
        self.num_cached_free = 0
        self._unknown_hash = bytes(32)  # zeros at the width of the hashes seen stored

    def __len__(self) -> int:
        return len(self.hashes)

    def cached_among(self, block_ids: Iterable[int]) -> list[int]:
        """The blocks of `block_ids` that hold a hash, in order."""
        return list(filter(self.hashes.__contains__, block_ids))

    def count_cached(self, block_ids: Iterable[int]) -> int:
        return sum(map(self.hashes.__contains__, block_ids))

    def store(self, block_ids: list[int], hashes: list[bytes]) -> None:
        """Blocks whose hashes just entered the cache."""
        self.hashes.update(zip(block_ids, hashes, strict=True))
        if hashes and len(hashes[0]) != len(self._unknown_hash):
            self._unknown_hash = bytes(len(hashes[0]))

    def fingerprint(
        self, block_ids: list[int], fingerprints: Iterable[bytes], stored_by: str
    ) -> None:
        """Keep the stored blocks' fingerprints and who stored them (collision check)."""
        self._fingerprints.update(zip(block_ids, fingerprints, strict=True))
        self._stored_by.update(zip(block_ids, repeat(stored_by), strict=False))

    def stored_fingerprint(self, block_id: int) -> tuple[bytes | None, str | None]:
        return self._fingerprints.get(block_id), self._stored_by.get(block_id)

    def hashes_of(self, block_ids: list[int]) -> list[bytes]:
        """The hashes the blocks were stored under (zeros for a block not seen stored: the
        hashes of a record are packed at one width)."""
        return list(map(self.hashes.get, block_ids, repeat(self._unknown_hash)))

    def forget(self, block_ids: list[int]) -> list[bytes]:
        """Blocks whose hashes vLLM dropped; returns those hashes."""
        hashes = list(map(self.hashes.pop, block_ids))
        if self._fingerprints:
            for block_id in block_ids:
                self._fingerprints.pop(block_id, None)
                self._stored_by.pop(block_id, None)
        return hashes

    def clear(self) -> int:
        """vLLM reset its prefix cache: forget everything; return how many blocks were cached."""
        num_cleared = len(self.hashes)
        self.hashes.clear()
        self._fingerprints.clear()
        self._stored_by.clear()
        self.num_cached_free = 0
        return num_cleared
