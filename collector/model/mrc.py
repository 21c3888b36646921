"""The miss-ratio curve in one pass: vLLM's prefix-cache hits at every cache size at once.

Mattson's stack algorithm over the block-reference stream (`collector/model/block_stream.py`),
with Fenwick trees over reference times counting the distinct blocks referenced since a
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

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from collector.model.block_stream import RequestBlocks

_SAMPLE_MODULUS = 1 << 24


class MovedMarkers:
    """Reference times whose block has been referenced again since (its marker moved up).

    Every reference time starts with a marker, so the live markers up to a time are that
    many times minus the moved ones. Two Fenwick trees give prefix counts with range
    updates: a request moves whole runs of consecutive times at once.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.slope = [0] * (size + 2)
        self.offset = [0] * (size + 2)

    def _add(self, tree: list[int], index: int, delta: int) -> None:
        size = self.size
        while index <= size:
            tree[index] += delta
            index += index & -index

    def move_range(self, first: int, last: int) -> None:
        """Mark times first..last (none marked before) as moved."""
        low, high = first + 1, last + 1
        self._add(self.slope, low, 1)
        self._add(self.slope, high + 1, -1)
        self._add(self.offset, low, low - 1)
        self._add(self.offset, high + 1, -high)

    def moved_through(self, time: int) -> int:
        """Moved markers at times 0..time."""
        slope = offset = 0
        index = time + 1
        end = index
        slope_tree, offset_tree = self.slope, self.offset
        while index > 0:
            slope += slope_tree[index]
            offset += offset_tree[index]
            index -= index & -index
        return slope * end - offset


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
    hit_blocks = np.cumsum(
        np.bincount(distances, minlength=1) * _count_scale(stream, sampled, block_size)
    )
    return MissRatioCurve(
        block_size=block_size,
        hit_blocks=hit_blocks,
        prompt_blocks=sum(-(-request.num_prompt_tokens // block_size) for request in stream),
        prompt_tokens=sum(request.num_prompt_tokens for request in stream),
        min_num_blocks=max((request.num_blocks for request in stream), default=0) + 1,
        num_requests=len(stream),
        sample_rate=sample_rate,
    )


def fleet_curve(curves: Sequence[MissRatioCurve]) -> MissRatioCurve:
    """A fleet's curve from its engines' own (one pool each, same block size): at every pool
    size per engine, the hits of all engines summed; `hits_at(S)` is the fleet's hits with
    each engine's pool at S blocks."""
    if not curves:
        raise ValueError("a fleet's curve needs at least one engine's curve")
    length = max(len(curve.hit_blocks) for curve in curves)
    # Past its last reuse distance an engine's hits stay at its top: pad with the last value.
    hit_blocks = sum(
        np.pad(curve.hit_blocks, (0, length - len(curve.hit_blocks)), mode="edge")
        for curve in curves
    )
    first = curves[0]
    return MissRatioCurve(
        block_size=first.block_size,
        hit_blocks=np.asarray(hit_blocks),
        prompt_blocks=sum(curve.prompt_blocks for curve in curves),
        prompt_tokens=sum(curve.prompt_tokens for curve in curves),
        min_num_blocks=max(curve.min_num_blocks for curve in curves),
        num_requests=sum(curve.num_requests for curve in curves),
        sample_rate=first.sample_rate,
    )


def _count_scale(
    stream: Sequence[RequestBlocks], sampled: Sequence[RequestBlocks | _Sampled], block_size: int
) -> float:
    """What one sampled hit stands for: all hit-eligible blocks / the sampled ones (a ratio
    estimate, steadier than 1 / sample rate when a few hot blocks carry many references)."""
    if sampled is stream:
        return 1.0
    eligible = sampled_eligible = 0
    for request, picked in zip(stream, sampled, strict=True):
        limit = max(request.num_prompt_tokens - 1, 0) // block_size
        eligible += min(limit, len(request.keys))
        sampled_eligible += sum(key is not None for key in picked.keys[:limit])
    return eligible / max(sampled_eligible, 1)


@dataclass(frozen=True, slots=True)
class _Sampled:
    """A request with only its sampled keys (None where a key was not sampled)."""

    keys: tuple[Hashable | None, ...]
    num_prompt_tokens: int
    num_blocks: int


def _spread(key: Hashable) -> int:
    """A key's sampling slot in [0, _SAMPLE_MODULUS): its hash, multiplied to mix the bits."""
    return (hash(key) * 0x9E3779B97F4A7C15 >> 20) % _SAMPLE_MODULUS


def _sampled_stream(stream: Sequence[RequestBlocks], sample_rate: float) -> list[_Sampled]:
    threshold = sample_rate * _SAMPLE_MODULUS
    return [
        _Sampled(
            tuple(key if _spread(key) < threshold else None for key in request.keys),
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
    stack = _Stack(sum(sum(key is not None for key in request.keys) for request in stream))
    distances: list[float] = []
    for request in stream:
        num_eligible = min((request.num_prompt_tokens - 1) // block_size, len(request.keys))
        distances += stack.hit_distances(request.keys, num_eligible, 1 / sample_rate)
        stack.reference(request.keys, num_eligible, request.num_blocks > len(request.keys))
    return np.ceil(np.asarray(distances, dtype=np.float64) - 1e-9).astype(np.int64)


class _Stack:
    """The LRU stack as reference times: each block's latest time holds its live marker."""

    def __init__(self, size: int) -> None:
        self.moved = MovedMarkers(size)
        self.last_time: dict[Hashable, int] = {}
        self.now = 0
        # The last request that held an uncached block (its first and last reference times)
        # and the runs of times moved since it ended.
        self.transient_start = self.transient_end = -1
        self.moved_since_transient: list[tuple[int, int]] = []

    def live_through(self, time: int) -> int:
        return time + 1 - self.moved.moved_through(time)

    def hit_distances(
        self, keys: Sequence[Hashable | None], num_eligible: int, scale: float
    ) -> list[float]:
        """Stack distances of a request's hit-eligible blocks (running maximum: hits are a
        prefix), before the request moves anything; stops at a block never seen."""
        live = self.live_through(self.now - 1)
        live_at_transient_end = self.live_through(self.transient_end)
        distances = []
        running = 0.0
        previous = through = -2
        for position in range(num_eligible):
            key = keys[position]
            if key is None:
                continue  # not sampled
            last = self.last_time.get(key)
            if last is None:
                break
            # The block just before in time is the previous key's own live marker.
            through = through - 1 if last == previous - 1 else self.live_through(last)
            previous = last
            distance = (live - through + 1) * scale
            if self.transient_start > last:
                depth_then = live_at_transient_end - through + self._moved_after(last) + 1
                distance = max(distance, depth_then * scale + 1)  # + the uncached block
            running = max(running, distance)
            distances.append(running)
        return distances

    def _moved_after(self, time: int) -> int:
        """Times after `time` (up to the transient's end) moved since the transient ended."""
        return sum(
            max(0, last - max(first, time + 1) + 1) for first, last in self.moved_since_transient
        )

    def reference(
        self, keys: Sequence[Hashable | None], num_eligible: int, holds_uncached: bool
    ) -> None:
        """The request's blocks, freed last block first, become the top of the stack."""
        start = self.now
        moved = []
        last_time = self.last_time
        for position in range(len(keys) - 1, -1, -1):
            key = keys[position]
            if key is None:
                continue
            last = last_time.get(key)
            # A block past the hit limit is computed again: its old copy stays cached.
            if last is not None and position < num_eligible:
                moved.append(last)
            last_time[key] = self.now
            self.now += 1
        for first, last in _runs(sorted(moved)):
            self.moved.move_range(first, last)
            if first <= self.transient_end:
                self.moved_since_transient.append((first, min(last, self.transient_end)))
        if holds_uncached:
            self.transient_start, self.transient_end = start, self.now - 1
            self.moved_since_transient.clear()


def _runs(times: list[int]) -> list[tuple[int, int]]:
    """Sorted times as runs of consecutive values: (first, last) pairs."""
    runs: list[tuple[int, int]] = []
    for time in times:
        if runs and runs[-1][1] == time - 1:
            runs[-1] = (runs[-1][0], time)
        else:
            runs.append((time, time))
    return runs
