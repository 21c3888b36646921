"""What the hooks know of vLLM's prefix cache, block by block (vLLM never reads it).

For every cached block: the hash it was stored under, when, how often it was hit since, and,
with the collision check, its fingerprint and the request that stored it; plus how many
cached blocks sit free (evictable). Dicts keyed by block id hold cached blocks only, so a
whole list of blocks is read or updated in C (map, filter, zip, update), with no Python loop
per block on vLLM's hot path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import repeat


class CacheShadow:
    """The hooks' mirror of which blocks hold a prefix-cache hash."""

    def __init__(self) -> None:
        self.hashes: dict[int, bytes] = {}
        self._stored_ns: dict[int, int] = {}
        self._num_hits: Counter[int] = Counter()
        self._fingerprints: dict[int, bytes] = {}
        self._stored_by: dict[int, str] = {}
        self.num_cached_free = 0

    def __len__(self) -> int:
        return len(self.hashes)

    def cached_among(self, block_ids: Iterable[int]) -> list[int]:
        """The blocks of `block_ids` that hold a hash, in order."""
        return list(filter(self.hashes.__contains__, block_ids))

    def count_cached(self, block_ids: Iterable[int]) -> int:
        return sum(map(self.hashes.__contains__, block_ids))

    def store(self, block_ids: list[int], hashes: list[bytes], now: int) -> None:
        """Blocks whose hashes just entered the cache (their hit counts start at 0)."""
        self.hashes.update(zip(block_ids, hashes, strict=True))
        self._stored_ns.update(zip(block_ids, repeat(now), strict=False))

    def fingerprint(
        self, block_ids: list[int], fingerprints: Iterable[bytes], stored_by: str
    ) -> None:
        """Keep the stored blocks' fingerprints and who stored them (collision check)."""
        self._fingerprints.update(zip(block_ids, fingerprints, strict=True))
        self._stored_by.update(zip(block_ids, repeat(stored_by), strict=False))

    def stored_fingerprint(self, block_id: int) -> tuple[bytes | None, str | None]:
        return self._fingerprints.get(block_id), self._stored_by.get(block_id)

    def hit(self, block_ids: list[int]) -> list[bytes]:
        """Count a hit on each block; return their hashes."""
        self._num_hits.update(block_ids)  # counted in C
        return list(map(self.hashes.get, block_ids, repeat(b"")))

    def forget(self, block_ids: list[int], now: int) -> tuple[list[bytes], list[int], list[int]]:
        """Blocks whose hashes vLLM dropped: their hashes, ages and hits while cached."""
        hashes = list(map(self.hashes.pop, block_ids))
        ages = list(map(now.__sub__, map(self._stored_ns.pop, block_ids)))
        hits = list(map(self._num_hits.pop, block_ids, repeat(0)))
        if self._fingerprints:
            for block_id in block_ids:
                self._fingerprints.pop(block_id, None)
                self._stored_by.pop(block_id, None)
        return hashes, ages, hits

    def clear(self) -> int:
        """vLLM reset its prefix cache: forget everything; return how many blocks were cached."""
        num_cleared = len(self.hashes)
        for shadow in (self.hashes, self._stored_ns, self._num_hits):
            shadow.clear()
        self._fingerprints.clear()
        self._stored_by.clear()
        self.num_cached_free = 0
        return num_cleared
