"""The miss-ratio curve in one pass: vLLM's prefix-cache hits at every cache size at once.

Mattson's stack algorithm over the block-reference stream (`collector/block_stream.py`),
with a Fenwick tree over reference times counting the distinct blocks referenced since a
block's last reference (its stack distance). A block is still cached in a pool of C usable
blocks exactly when its distance is at most C, because vLLM's pool behaves as an LRU stack
of cached blocks when one request runs at a time:

- a request's blocks go back to the free queue's tail in reverse order (its last block is
  evicted first), so the reference order of a request is its blocks from last to first;
- hits are looked up and taken out of the free queue before any block is allocated, so a
  request's hits are judged on the stack as it was before the request;
- hits form a prefix and stop at `num_prompt_tokens - 1` (the last prompt token is always
  computed), so a block counts as hit at size C when it and every block before it have
  distance <= C;
- uncached blocks (a partial last block) go to the free queue's head and are reused first:
  they take no room after their request, but while it runs they do, which evicts one more
  block then; a block's distance is therefore raised to its depth after that request + 1;
- a block that is computed again while an earlier copy is still cached (vLLM does not
  de-duplicate) leaves the old copy in the stack as dead weight;
- vLLM's null block takes one of the pool's blocks: C = num_blocks - 1.

Optional SHARDS sampling (Waldspurger et al., FAST'15) keeps only the blocks whose key
hashes under `sample_rate` and scales distances and counts by 1 / sample_rate.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from collector.block_stream import RequestBlocks

_SAMPLE_MODULUS = 1 << 24


class Fenwick:
    """Counts of live markers at reference times, with prefix sums in O(log n)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.tree = [0] * (size + 1)

    def add(self, position: int, delta: int) -> None:
        tree = self.tree
        size = self.size
        index = position + 1
        while index <= size:
            tree[index] += delta
            index += index & -index

    def count_through(self, position: int) -> int:
        """Live markers at times 0..position."""
        tree = self.tree
        total = 0
        index = position + 1
        while index > 0:
            total += tree[index]
            index -= index & -index
        return total


@dataclass(frozen=True)
class MissRatioCurve:
    """Hit blocks at every pool size, from one pass over a block-reference stream."""

    block_size: int
    hit_blocks: np.ndarray  # hit_blocks[c]: blocks hit with c usable blocks
    prompt_blocks: int  # sum of ceil(prompt tokens / block size): vLLM's lookup blocks
    prompt_tokens: int
    min_num_blocks: int  # the smallest pool (null block included) every request fits in
    num_requests: int
    sample_rate: float = 1.0

    def hits_at(self, num_blocks: int) -> float:
        """Blocks hit with a pool of `num_blocks` (vLLM's null block included)."""
        usable = max(num_blocks - 1, 0)
        return float(self.hit_blocks[min(usable, len(self.hit_blocks) - 1)])

    def block_hit_ratio(self, num_blocks: int) -> float:
        """Hit blocks / prompt blocks (a partial last block counts), as `kvscope summary`."""
        return self.hits_at(num_blocks) / self.prompt_blocks if self.prompt_blocks else 0.0

    def token_hit_ratio(self, num_blocks: int) -> float:
        """Hit tokens / prompt tokens: vLLM's own prefix-cache hit ratio."""
        hit_tokens = self.hits_at(num_blocks) * self.block_size
        return hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def saturation_num_blocks(self) -> int:
        """The smallest pool that reaches the curve's top (an infinite cache's hits)."""
        top = self.hit_blocks[-1]
        return int(np.argmax(self.hit_blocks >= top)) + 1

    def points(self, max_points: int = 200) -> tuple[np.ndarray, np.ndarray]:
        """(num_blocks, token hit ratio) at about `max_points` pool sizes, for charts."""
        last = max(self.saturation_num_blocks, self.min_num_blocks) * 5 // 4 + 1
        sizes = np.unique(np.linspace(self.min_num_blocks, last, max_points).astype(np.int64))
        usable = np.minimum(sizes - 1, len(self.hit_blocks) - 1)
        ratios = self.hit_blocks[usable] * self.block_size / max(self.prompt_tokens, 1)
        return sizes, ratios


def miss_ratio_curve(
    stream: Sequence[RequestBlocks], block_size: int, sample_rate: float = 1.0
) -> MissRatioCurve:
    """Hit blocks at every pool size for a stream replayed one request at a time."""
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample rate must be in (0, 1], got {sample_rate}")
    sampled = _sampled_stream(stream, sample_rate) if sample_rate < 1 else stream
    distances = _hit_distances(sampled, block_size, sample_rate)
    hit_blocks = np.cumsum(np.bincount(distances, minlength=1) / sample_rate)
    return MissRatioCurve(
        block_size=block_size,
        hit_blocks=hit_blocks,
        prompt_blocks=sum(-(-request.num_prompt_tokens // block_size) for request in stream),
        prompt_tokens=sum(request.num_prompt_tokens for request in stream),
        min_num_blocks=max((request.num_blocks for request in stream), default=0) + 1,
        num_requests=len(stream),
        sample_rate=sample_rate,
    )


@dataclass(frozen=True, slots=True)
class _Sampled:
    """A request with only its sampled keys (None where a key was not sampled)."""

    keys: tuple[Hashable | None, ...]
    num_prompt_tokens: int
    num_blocks: int


def _sampled_stream(stream: Sequence[RequestBlocks], sample_rate: float) -> list[_Sampled]:
    threshold = sample_rate * _SAMPLE_MODULUS
    return [
        _Sampled(
            tuple(key if hash(key) % _SAMPLE_MODULUS < threshold else None for key in request.keys),
            request.num_prompt_tokens,
            request.num_blocks,
        )
        for request in stream
    ]


def _hit_distances(
    stream: Sequence[RequestBlocks | _Sampled], block_size: int, sample_rate: float
) -> np.ndarray:
    """For every (sampled) block that hits in a large enough pool: the smallest number of
    usable blocks it hits with."""
    total = sum(sum(key is not None for key in request.keys) for request in stream)
    tree = Fenwick(total)
    last_time: dict[Hashable, int] = {}
    distances: list[int] = []
    now = 0
    # The last request that held an uncached block: its first and last reference times, and
    # the earlier times of blocks referenced again since it ended.
    transient_start = transient_end = -1
    moved_since_transient: list[int] = []
    phantom = round(1 / sample_rate)  # an uncached block, in sampled units
    for request in stream:
        keys = request.keys
        num_eligible = min((request.num_prompt_tokens - 1) // block_size, len(keys))
        live = tree.count_through(now - 1) if now else 0
        running = 0
        for position in range(num_eligible):
            key = keys[position]
            if key is None:
                continue
            last = last_time.get(key)
            if last is None:
                break
            distance = live - tree.count_through(last) + 1
            if transient_start > last:
                depth_then = (
                    tree.count_through(transient_end)
                    - tree.count_through(last)
                    + len(moved_since_transient)
                    - bisect.bisect_right(moved_since_transient, last)
                    + 1
                )
                distance = max(distance, depth_then + phantom)
            running = max(running, distance)
            distances.append(running)
        start = now
        for position in range(len(keys) - 1, -1, -1):
            key = keys[position]
            if key is None:
                continue
            last = last_time.get(key)
            # A block past the hit limit is computed again: its old copy stays cached.
            if last is not None and position < num_eligible:
                tree.add(last, -1)
                if last <= transient_end:
                    bisect.insort(moved_since_transient, last)
            tree.add(now, 1)
            last_time[key] = now
            now += 1
        if request.num_blocks > len(keys):
            transient_start, transient_end = start, now - 1
            moved_since_transient.clear()
    return np.ceil(np.asarray(distances, dtype=np.float64) / sample_rate).astype(np.int64)
