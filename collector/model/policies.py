"""Cache policies replayed on the block-reference stream, one request at a time: vLLM's LRU,
LRU with pinned prefix families, LRU with admission control, and Belady's MIN, the ceiling
no policy can pass.

The pool is the one `mrc.py` models: `num_blocks` blocks, one of them vLLM's null block. A
request takes its hits (the longest cached prefix of its blocks, up to the block before its
last prompt token) out of the pool, allocates the rest of its blocks (an empty block first,
else it evicts a cached one), then frees them all: its full blocks stay cached, a partial
last block goes back empty. Under LRU the pool is vLLM's free queue: freed blocks join its
tail last block first, empty ones its head, and eviction takes the head.

Belady's MIN evicts the cached block whose next hit lies furthest ahead (never hit again:
first), the deeper one on a tie. A block's next hit is never before its parent's (a request
that hits a block hits every block before it), so the cache MIN keeps is always a prefix
tree, as vLLM's prefix rule needs: MIN is optimal among policies that keep prefixes, and
its hit ratio is the ceiling for every one of them at that pool size.
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict, defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from collector.model.block_stream import RequestBlocks

POLICIES = ("lru", "pin", "admit", "min")
NEVER = 1 << 62  # a next use past the stream's end


class Tier(Protocol):
    """A slower tier behind the GPU pool (`collector/replay/cpu_tier.py`): per request,
    `start`, `load` the blocks after the GPU hits (returns how many it held from the first
    on), `store` (offer) the prompt's full blocks, `finish`."""

    def start(self, request_id: str) -> None: ...

    def load(self, keys: Sequence[Hashable]) -> int: ...

    def store(self, keys: Sequence[Hashable]) -> None: ...

    def finish(self) -> None: ...


class ReplayTooLarge(ValueError):
    """A stream with more block references than its replays take in reasonable time."""


def check_replay_size(stream: Sequence[RequestBlocks], limit: int, what: str) -> None:
    """ReplayTooLarge when the stream has more than `limit` block references (`what`: the
    replays that would take them, and how long)."""
    references = sum(len(request.keys) for request in stream)
    if references > limit:
        raise ReplayTooLarge(
            f"the run has {references:,} block references, more than the {limit:,} {what}"
        )


@dataclass(frozen=True)
class PolicyResult:
    """What one policy did with one pool size: blocks hit in the GPU pool, and blocks
    loaded back from a tier behind it (if any)."""

    policy: str
    num_blocks: int
    hit_blocks: int
    prompt_tokens: int
    block_size: int
    pinned_blocks: int = 0
    tier_hit_blocks: int = 0
    tier_hit_positions: int = 0  # the sum of the tier hits' positions in their prompts

    @property
    def token_hit_ratio(self) -> float:
        """Prompt tokens not computed: GPU hits and tier hits."""
        return self._share(self.hit_blocks + self.tier_hit_blocks)

    @property
    def gpu_token_hit_ratio(self) -> float:
        return self._share(self.hit_blocks)

    def _share(self, blocks: int) -> float:
        return blocks * self.block_size / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class _Pool:
    """Blocks by id: each free block's key (None: empty), and where each key is cached."""

    usable: int
    free: OrderedDict[int, Hashable | None] = field(default_factory=OrderedDict)
    cached: dict[Hashable, list[int]] = field(default_factory=lambda: defaultdict(list))

    def __post_init__(self) -> None:
        self.free.update((block, None) for block in range(self.usable))

    def take(self, block: int) -> None:
        key = self.free.pop(block)
        if key is not None:
            self.cached[key].remove(block)
            if not self.cached[key]:
                del self.cached[key]

    def cached_block(self, key: Hashable) -> int | None:
        copies = self.cached.get(key)
        return copies[0] if copies else None


def replay_policy(
    stream: Sequence[RequestBlocks],
    block_size: int,
    num_blocks: int,
    policy: str = "lru",
    *,
    pinned: Iterable[Hashable] = (),
    not_admitted: Iterable[Hashable] = (),
    max_pinned: int | None = None,
    tier: Tier | None = None,
) -> PolicyResult:
    """Replay the stream through a pool of `num_blocks` under `policy`:
    - "lru": vLLM's;
    - "pin": LRU, but blocks whose keys are in `pinned` never leave the cache once stored,
      up to `max_pinned` blocks (half the pool unless given), never taking the room the
      largest request needs;
    - "admit": LRU, but blocks whose keys are in `not_admitted` go back empty;
    - "min": Belady's.
    With a `tier`, blocks after the GPU hits that the tier holds are loaded back (they count
    as `tier_hit_blocks`), and the prompt's full blocks are offered to it (as vLLM's
    connector offers them: from the first, GPU hits too; it stores those it does not hold)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; use one of {POLICIES}")
    pool = _Pool(num_blocks - 1)
    largest = max((request.num_blocks for request in stream), default=0)
    if pool.usable < largest:
        raise ValueError(f"a request needs more than the {num_blocks} blocks of the pool")
    belady = _Belady(_NextHits(stream, block_size)) if policy == "min" else None
    pinned_keys = set(pinned) if policy == "pin" else set()
    dropped = set(not_admitted) if policy == "admit" else set()
    # Pins never take the room the largest request needs.
    limit = min(pool.usable // 2 if max_pinned is None else max_pinned, pool.usable - largest)
    pins = _Pins({}, pinned_keys, limit)
    hits = tier_hits = tier_positions = 0
    for index, request in enumerate(stream):
        eligible = min((request.num_prompt_tokens - 1) // block_size, len(request.keys))
        used = _take_cached_prefix(pool, pins, request.keys[:eligible])
        hits += len(used)
        if tier is not None:
            tier.start(f"request-{index}")
            loaded = tier.load(request.keys[len(used) : eligible])
            tier_hits += loaded
            tier_positions += loaded * len(used) + loaded * (loaded - 1) // 2
        blocks = used + [_allocate(pool, belady) for _ in range(request.num_blocks - len(used))]
        _free(pool, request, blocks, pins, dropped)
        if tier is not None:
            tier.store(request.keys[: request.num_prompt_tokens // block_size])  # full blocks
            tier.finish()
        if belady is not None:
            belady.push(pool, request, blocks, index)
    return PolicyResult(
        policy=policy,
        num_blocks=num_blocks,
        hit_blocks=hits,
        prompt_tokens=sum(request.num_prompt_tokens for request in stream),
        block_size=block_size,
        pinned_blocks=len(pins.held),
        tier_hit_blocks=tier_hits,
        tier_hit_positions=tier_positions,
    )


def _take_cached_prefix(pool: _Pool, pins: _Pins, keys: Sequence[Hashable]) -> list[int]:
    """The blocks of the longest prefix of `keys` the cache holds (pinned, or taken from the
    free queue)."""
    used: list[int] = []
    for key in keys:
        block = pins.held.get(key)
        if block is None:
            block = pool.cached_block(key)
            if block is None:
                break
            pool.take(block)
        used.append(block)
    return used


def _allocate(pool: _Pool, belady: _Belady | None) -> int:
    """A block for new content: an empty one first (the free queue's head under LRU), else
    the policy's victim."""
    head, key = next(iter(pool.free.items()))
    if key is None or belady is None:
        pool.take(head)
        return head
    return belady.victim(pool)


class _Belady:
    """Belady's victims: the cached block whose key's next hit is furthest (of equals, the
    deepest), from a heap of (-next hit, -position, block, version), its stale entries
    (an older version of the block's) skipped."""

    def __init__(self, next_hits: _NextHits) -> None:
        self.next_hits = next_hits
        self.heap: list[tuple[int, int, int, int]] = []
        self.versions: dict[int, int] = {}

    def victim(self, pool: _Pool) -> int:
        while True:
            _, _, block, version = heapq.heappop(self.heap)
            if self.versions.get(block) == version and pool.free.get(block) is not None:
                self.versions[block] = version + 1
                pool.take(block)
                return block

    def push(self, pool: _Pool, request: RequestBlocks, blocks: list[int], index: int) -> None:
        """Each block request `index` left cached, by its key's next hit after it."""
        for offset, key in enumerate(request.keys):
            block = blocks[offset]
            if pool.free.get(block) == key:
                version = self.versions.get(block, 0) + 1
                self.versions[block] = version
                # A second cached copy of a key (computed again past the hit limit)
                # serves nothing the first does not.
                duplicate = len(pool.cached[key]) > 1
                upcoming = NEVER if duplicate else self.next_hits.after(key, index)
                heapq.heappush(self.heap, (-upcoming, -offset, block, version))


@dataclass
class _Pins:
    """The pinned blocks (key -> block), which keys to pin, and how many blocks at most."""

    held: dict[Hashable, int]
    wanted: set[Hashable]
    limit: int

    def keeps(self, key: Hashable, block: int) -> bool:
        """Whether the block stays pinned (or becomes pinned) instead of being freed."""
        if self.held.get(key) == block:
            return True
        if key in self.wanted and key not in self.held and len(self.held) < self.limit:
            self.held[key] = block
            return True
        return False


def _free(
    pool: _Pool,
    request: RequestBlocks,
    blocks: list[int],
    pins: _Pins,
    dropped: set[Hashable],
) -> None:
    """The request's blocks back to the pool, last first: full ones cached (unless pinned,
    or not admitted: then empty), the partial last one empty at the free queue's head.
    Pins go first to a family's first blocks, which every hit on it needs."""
    kept = {
        block for key, block in zip(request.keys, blocks, strict=False) if pins.keeps(key, block)
    }
    for offset in range(len(blocks) - 1, -1, -1):
        block = blocks[offset]
        key = request.keys[offset] if offset < len(request.keys) else None
        if block in kept:
            continue
        if key is None or key in dropped:
            pool.free[block] = None
            pool.free.move_to_end(block, last=False)
        else:
            pool.free[block] = key
            pool.cached[key].append(block)


class _NextHits:
    """For each key, the requests that could hit it (it lies before their hit limit)."""

    def __init__(self, stream: Sequence[RequestBlocks], block_size: int) -> None:
        self.uses: dict[Hashable, list[int]] = defaultdict(list)
        for index, request in enumerate(stream):
            eligible = min((request.num_prompt_tokens - 1) // block_size, len(request.keys))
            for key in request.keys[:eligible]:
                self.uses[key].append(index)

    def after(self, key: Hashable, index: int) -> int:
        uses = self.uses.get(key, [])
        at = bisect.bisect_right(uses, index)
        return uses[at] if at < len(uses) else NEVER


def family_roots(stream: Sequence[RequestBlocks]) -> dict[Hashable, list[Hashable]]:
    """Each prefix family (keyed by its first block) and every key under it, in first-seen
    order."""
    families: dict[Hashable, dict[Hashable, None]] = defaultdict(dict)
    for request in stream:
        if request.keys:
            families[request.keys[0]].update(dict.fromkeys(request.keys))
    return {root: list(keys) for root, keys in families.items()}


def hottest_families(
    stream: Sequence[RequestBlocks], block_size: int, count: int
) -> list[list[Hashable]]:
    """The `count` prefix families (by first block) whose blocks the stream could hit most
    often (references before the hit limit, after each block's first), each as its keys."""
    reuses: dict[Hashable, int] = defaultdict(int)
    seen: set[Hashable] = set()
    for request in stream:
        eligible = min((request.num_prompt_tokens - 1) // block_size, len(request.keys))
        for key in request.keys[:eligible]:
            if key in seen:
                reuses[request.keys[0]] += 1
        seen.update(request.keys)
    families = family_roots(stream)
    ranked = sorted(reuses, key=lambda root: -reuses[root])[:count]
    return [families[root] for root in ranked]


def one_off_families(
    stream: Sequence[RequestBlocks], block_size: int, window: int
) -> list[list[Hashable]]:
    """Prefix families whose first block no request hits within `window` requests after
    another used it: caching them only evicts others (admission control leaves them out)."""
    last_use: dict[Hashable, int] = {}
    reused: set[Hashable] = set()
    for index, request in enumerate(stream):
        if not request.keys:
            continue
        root = request.keys[0]
        eligible = (request.num_prompt_tokens - 1) // block_size >= 1
        if eligible and root in last_use and index - last_use[root] <= window:
            reused.add(root)
        last_use[root] = index
    return [keys for root, keys in family_roots(stream).items() if root not in reused]
