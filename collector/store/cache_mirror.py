"""What the collector knows of each engine's prefix cache, block by block, from its records.

The hooks keep no per-block state in the engine (`engine_hooks/hooks.py`): each record says
what vLLM just did to which blocks. The collector mirrors the cache from that stream, per
engine and DP rank, and completes the records with what follows from it:
- an `Allocate` of blocks the stream last left cached evicts them (vLLM drops the hash of a
  cached free block it hands out again): an `Evict` of those blocks, with the hashes they
  were stored under, goes just before it, under the same record number and request;
- a `Pool` gets the number of cached blocks among the free (`num_cached_free`) and, once the
  stream has named a group other than 0, the blocks in use by each group;
- a `Reset` gets the number of cached blocks it cleared;
- a `Free` or an `Evict` gets the KV cache group of each of its blocks: the group of the
  block's last allocation or reuse (one call of vLLM frees blocks of several groups);
- a `Free` the hooks sent without reference counts (a dense layout's) gets them: vLLM sets a
  block's count to 1 when it hands the block out and adds 1 per hit, and a free takes 1.

Per block the mirror holds the low 64 bits of its hash (as the run file keeps them), whether
it is cached, whether it sits in vLLM's free queue, its reference count and its KV cache
group (18 bytes a block); each record updates them with a few array operations, no Python
loop per block. Its arrays reach only as far as the highest block id the stream has named
(rounded up to GROWTH_BLOCKS), not the pool its first batch claimed: the collector bounds
block ids by each engine's pool and the pools by its own limits (`collector/live/limits.py`),
so an engine's mirror holds at most 18 bytes times its pool plus GROWTH_BLOCKS. The
mirror is exact while the stream is whole. Records lost on the way (a `Drop`) leave it wrong
about the blocks they touched until those blocks are stored again: an eviction of a block
whose store was lost is missed, the cached-free count can be off (it never goes below 0 or
past the free count), and a lost hit or free leaves a block's reference count off until vLLM
hands the block out again (a count never goes below 0). A hit re-learns the hashes of its
blocks. A collector resumed on a run file starts from the state the file's rows leave
(`RunStore.resume`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from collector.store.ingest import low_64_bits
from engine_hooks.events import (
    INT32_MAX,
    Allocate,
    Event,
    Evict,
    Free,
    Hit,
    Pool,
    Reset,
    Store,
    hash_width,
)

Engine = tuple[str, int]  # engine id, DP rank

# The arrays grow in steps of this many blocks (295 KB), to the highest block id named: an
# engine whose pool is larger than the run's first one, or a run whose first engine's pool
# is not known (vLLM's KV events), costs what its blocks cost and no more.
GROWTH_BLOCKS = 16_384


# Per engine and block, what its rows left it: its KV cache group (of its last allocation,
# hit or store), whether it is cached (stored or hit after its last allocation, eviction and
# reset), with which hash, whether it is free (unreferenced after its last allocation, hit,
# store or free), and its reference count (the count its last allocation or free left, plus
# the hits since).
BLOCK_STATES_SQL = """
    WITH block_rows AS (
        SELECT coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank,
            seq, kind::VARCHAR AS kind, block_id, block_hash, ref_cnt, kv_group
        FROM events WHERE kind IN ('store', 'hit', 'allocate', 'evict', 'free')
    ),
    resets AS (
        SELECT coalesce(engine_id, '') AS engine, coalesce(dp_rank, 0) AS rank,
            max(seq) AS reset_seq
        FROM events WHERE kind = 'reset' GROUP BY ALL
    ),
    blocks AS (
        SELECT engine, rank, block_id,
            max(seq) FILTER (WHERE kind IN ('store', 'hit')) AS cached_seq,
            max(seq) FILTER (WHERE kind IN ('allocate', 'evict')) AS uncached_seq,
            arg_max(block_hash, seq) FILTER (WHERE kind IN ('store', 'hit')) AS block_hash,
            arg_max(kind = 'free' AND ref_cnt = 0, seq)
                FILTER (WHERE kind IN ('store', 'hit', 'allocate', 'free')) AS free,
            arg_max(kv_group, seq)
                FILTER (WHERE kind IN ('store', 'hit', 'allocate')) AS kv_group,
            max(seq) FILTER (WHERE kind IN ('allocate', 'free')) AS counted_seq,
            arg_max(CASE WHEN kind = 'free' THEN ref_cnt ELSE 1 END, seq)
                FILTER (WHERE kind IN ('allocate', 'free')) AS counted
        FROM block_rows GROUP BY ALL
    ),
    hits_since AS (
        SELECT engine, rank, block_id, count(*) AS num_hits
        FROM block_rows JOIN blocks USING (engine, rank, block_id)
        WHERE kind = 'hit' AND seq > coalesce(counted_seq, -1)
        GROUP BY ALL
    )
    SELECT engine, rank, block_id, coalesce(block_hash, 0) AS block_hash,
        coalesce(free, false) AS free, coalesce(kv_group, 0) AS kv_group,
        cached_seq IS NOT NULL
            AND (uncached_seq IS NULL OR cached_seq > uncached_seq)
            AND (reset_seq IS NULL OR cached_seq > reset_seq) AS cached,
        coalesce(counted, 0) + coalesce(num_hits, 0) AS ref_cnt
    FROM blocks LEFT JOIN resets USING (engine, rank)
        LEFT JOIN hits_since USING (engine, rank, block_id)
    ORDER BY engine, rank, block_id
"""


class CacheMirror:
    """One engine's prefix cache as its record stream says it is."""

    def __init__(self, num_blocks: int) -> None:
        """A mirror with room for `num_blocks` blocks at first (it grows to the block ids
        the stream names)."""
        self._hashes = np.zeros(num_blocks, dtype=np.uint64)
        self._cached = np.zeros(num_blocks, dtype=bool)
        self._free = np.ones(num_blocks, dtype=bool)  # in vLLM's free queue (as all start)
        self._ref_cnts = np.zeros(num_blocks, dtype=np.int32)
        self._groups = np.zeros(num_blocks, dtype=np.int32)
        self._num_groups = 1  # the groups the stream has named so far
        self.num_cached_free = 0

    @property
    def num_cached(self) -> int:
        return int(np.count_nonzero(self._cached))

    def restore(self, blocks: pd.DataFrame) -> None:
        """Start from the blocks a run file's rows leave (`BLOCK_STATES_SQL`'s columns)."""
        block_ids = blocks["block_id"].to_numpy(np.int64)
        self._fit(block_ids)
        groups = blocks["kv_group"].to_numpy(np.int32)
        self._groups[block_ids] = groups
        self._num_groups = max(self._num_groups, int(groups.max(initial=0)) + 1)
        self._free[block_ids] = blocks["free"].to_numpy(bool)  # nothing is cached yet
        self._ref_cnts[block_ids] = blocks["ref_cnt"].to_numpy(np.int32)
        cached = block_ids[blocks["cached"].to_numpy(bool)]
        self._hashes[cached] = blocks["block_hash"].to_numpy(np.uint64)[blocks["cached"]]
        self._set(cached, cached=True)

    def complete(self, record: Event) -> Evict | None:
        """Update the mirror with one record, filling what the hooks left to the collector;
        for an `Allocate` that evicts, return the `Evict` that goes before it."""
        if isinstance(record, Allocate):
            return self._allocate(record)
        if isinstance(record, Hit | Store):  # a hit re-learns what a lost store said
            block_ids = self._block_ids(record)
            self._hashes[block_ids] = low_64_bits(record.block_hashes, hash_width(record))
            self._set_group(block_ids, record.kv_group)
            self._set(block_ids, cached=True, free=False)
            if isinstance(record, Hit):
                self._add_references(block_ids)
        elif isinstance(record, Free):
            block_ids = self._block_ids(record)
            record.kv_groups = self._groups[block_ids].astype("<i4").tobytes()
            self._free_blocks(record, block_ids)
        elif isinstance(record, Evict):
            block_ids = self._block_ids(record)
            record.kv_groups = self._groups[block_ids].astype("<i4").tobytes()
            self._set(block_ids, cached=False)
        elif isinstance(record, Reset):
            record.num_cleared = self.num_cached
            self._cached[:] = False
            self.num_cached_free = 0
        elif isinstance(record, Pool):
            record.num_cached_free = min(self.num_cached_free, record.num_free)
            if self._num_groups > 1:
                in_use = self._groups[~self._free]
                record.num_in_use_by_group = np.bincount(
                    in_use, minlength=self._num_groups
                ).tolist()
        return None

    def _allocate(self, record: Allocate) -> Evict | None:
        block_ids = self._block_ids(record)
        evicted = block_ids[self._cached[block_ids]]
        evicted_groups = self._groups[evicted]
        self._set_group(block_ids, record.kv_group)
        self._set(block_ids, cached=False, free=False)
        self._ref_cnts[block_ids] = 1
        if not evicted.size:
            return None
        return Evict(
            record.seq,
            record.ts_ns,
            record.request_id,
            evicted.astype("<i4").tobytes(),
            self._hashes[evicted].astype(">u8").tobytes(),
            evicted_groups.astype("<i4").tobytes(),
            engine_id=record.engine_id,
            dp_rank=record.dp_rank,
        )

    def _add_references(self, block_ids: np.ndarray) -> None:
        """One more reference to each block per time the ids name it; a count stops at
        2^31 - 1 (only a stream no engine sends gets there: vLLM's counts are the requests
        sharing a block)."""
        if block_ids.size and int(self._ref_cnts[block_ids].max()) >= INT32_MAX - block_ids.size:
            blocks, hits = np.unique(block_ids, return_counts=True)
            counts = self._ref_cnts[blocks].astype(np.int64) + hits
            self._ref_cnts[blocks] = np.minimum(counts, INT32_MAX)
        else:
            np.add.at(self._ref_cnts, block_ids, 1)

    def _free_blocks(self, record: Free, block_ids: np.ndarray) -> None:
        """Release the blocks: their counts are the record's, where the hooks sent them, or
        one less than before (and the record gets them); those at 0 join the free queue."""
        if record.ref_cnts is None:
            np.subtract.at(self._ref_cnts, block_ids, 1)
            ref_cnts = np.maximum(self._ref_cnts[block_ids], 0)
            record.ref_cnts = ref_cnts.astype("<i4").tobytes()
        else:
            ref_cnts = np.frombuffer(record.ref_cnts, dtype="<i4")
        self._ref_cnts[block_ids] = ref_cnts
        self._set(block_ids[ref_cnts == 0], free=True)

    def _set_group(self, block_ids: np.ndarray, group: int) -> None:
        self._groups[block_ids] = group
        self._num_groups = max(self._num_groups, group + 1)

    def _block_ids(self, record: Hit | Allocate | Store | Evict | Free) -> np.ndarray:
        block_ids = np.frombuffer(record.block_ids, dtype="<i4")
        self._fit(block_ids)
        return block_ids

    def _fit(self, block_ids: np.ndarray) -> None:
        """Grow the arrays to hold every block id, to the next multiple of GROWTH_BLOCKS."""
        if block_ids.size and int(block_ids.max()) >= self._cached.size:
            size = (int(block_ids.max()) // GROWTH_BLOCKS + 1) * GROWTH_BLOCKS
            for name in ("_hashes", "_cached", "_free", "_ref_cnts", "_groups"):
                array = getattr(self, name)
                grown = np.full(size, name == "_free", dtype=array.dtype)
                grown[: array.size] = array
                setattr(self, name, grown)

    def _set(
        self,
        block_ids: np.ndarray,
        cached: bool | None = None,
        free: bool | np.ndarray | None = None,
    ) -> None:
        """Set the blocks' states, keeping the count of cached blocks among the free."""
        before = np.count_nonzero(self._cached[block_ids] & self._free[block_ids])
        if cached is not None:
            self._cached[block_ids] = cached
        if free is not None:
            self._free[block_ids] = free
        after = np.count_nonzero(self._cached[block_ids] & self._free[block_ids])
        self.num_cached_free += int(after) - int(before)


class CacheMirrors:
    """The mirrors of every engine whose records a run file stores."""

    def __init__(self, num_blocks: int) -> None:
        """`num_blocks`: the run's pool, as its first engine said; every mirror starts with
        room for at most GROWTH_BLOCKS of it, and grows to the blocks its engine names."""
        self._num_blocks = min(num_blocks, GROWTH_BLOCKS)
        self._mirrors: dict[Engine, CacheMirror] = {}

    def mirror(self, engine: Engine) -> CacheMirror:
        mirror = self._mirrors.get(engine)
        if mirror is None:
            mirror = self._mirrors[engine] = CacheMirror(self._num_blocks)
        return mirror

    def restore(self, blocks: pd.DataFrame) -> None:
        """Start every engine's mirror from `BLOCK_STATES_SQL`'s rows."""
        for _, rows in blocks.groupby(["engine", "rank"]):
            engine = (str(rows["engine"].iloc[0]), int(rows["rank"].iloc[0]))
            self.mirror(engine).restore(rows)

    def complete(self, records: Iterable[Event]) -> list[Event]:
        """The records, completed in order, with the evictions they imply before them."""
        completed: list[Event] = []
        engine: Engine | None = None
        mirror = None
        for record in records:
            if isinstance(record, Hit | Allocate | Store | Free | Evict | Reset | Pool):
                if (record.engine_id, record.dp_rank) != engine:
                    engine = (record.engine_id, record.dp_rank)
                    mirror = self.mirror(engine)
                assert mirror is not None
                evict = mirror.complete(record)
                if evict is not None:
                    completed.append(evict)
            completed.append(record)
        return completed
