"""Running totals of a live run, kept by the receiver for the Prometheus exporter.

What it keeps is bounded by the collector's limits (`limits.py`), whatever the engines send:
past `tenants` tenant names and `adapters` LoRA adapter names, the rest are counted under
OTHER (so the series a scrape returns are bounded too); per engine and DP rank it keeps a
few numbers, and the receiver admits at most `engines` of them; the tenant of a request in
flight is remembered until its lookup, for at most `requests` requests (the oldest are
forgotten first: a request that never finishes does not stay); the hashes evicted lately, to
count a prefix stored again after its eviction (recomputed), at most `EVICTED_HASHES` of them.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from collector.live.limits import Limits
from engine_hooks.events import (
    Arrive,
    Collision,
    Drop,
    Event,
    Evict,
    Finish,
    Hit,
    Lookup,
    Pool,
    Store,
    num_blocks,
    unpack_hashes,
)
from engine_hooks.transport import BatchHeader

Labels = tuple[str, str]  # tenant, LoRA adapter ("" when unknown or none)
OTHER = "other"  # the label of the tenants and adapters past the limits
Engine = tuple[str, int]  # engine id, DP rank
# Evicted hashes remembered to recognise a recomputed prefix (about 150 bytes each): a store
# of a hash evicted longer ago than the last EVICTED_HASHES evictions is not counted.
EVICTED_HASHES = 1 << 16


@dataclass
class LiveState:
    """What the exporter reports; `observe` is called with every stored batch, and with an
    engine's closing batch as it shuts down (`BatchHeader.stopped_ns`), which ends its pool,
    in-flight and last-record gauges: a stopped engine's alerts resolve, they do not page."""

    limits: Limits = field(default_factory=Limits)
    query_tokens: Counter[Labels] = field(default_factory=Counter)
    hit_tokens: Counter[Labels] = field(default_factory=Counter)
    requests: Counter[Labels] = field(default_factory=Counter)
    block_hits: int = 0
    block_stores: int = 0
    block_evictions: int = 0
    collisions: int = 0
    missing_records: int = 0
    block_recomputes: int = 0
    pool: dict[Engine, tuple[int, int, int]] = field(default_factory=dict)
    pool_blocks: dict[Engine, int] = field(default_factory=dict)  # usable (no null block)
    engine_dropped: dict[Engine, tuple[int, int]] = field(default_factory=dict)
    last_record_s: dict[Engine, float] = field(default_factory=dict)  # Unix time received
    in_flight: Counter[Engine] = field(default_factory=Counter)  # arrived, not yet finished
    clock: Callable[[], float] = time.time
    lock: threading.Lock = field(default_factory=threading.Lock)
    # (engine, block hash) of the latest evictions, oldest first.
    _evicted: OrderedDict[tuple[Engine, bytes], None] = field(default_factory=OrderedDict)
    # Request id -> its tenant's label, oldest arrival first.
    _tenants: OrderedDict[str, str] = field(default_factory=OrderedDict)
    _tenant_names: set[str] = field(default_factory=set)
    _adapter_names: set[str] = field(default_factory=set)

    def observe(self, header: BatchHeader, records: list[Event]) -> None:
        with self.lock:
            engine = (header.engine_id, header.dp_rank)
            self.engine_dropped[engine] = (
                header.num_lost_in_engine,
                header.num_dropped_in_transport,
            )
            self.pool_blocks[engine] = max(header.config.num_blocks - 1, 0)
            self.last_record_s[engine] = self.clock()
            for record in records:
                self._observe(engine, record)
            if header.stopped_ns:  # it shut down: its gauges' series end with it
                for gauge in (self.pool, self.pool_blocks, self.last_record_s, self.in_flight):
                    gauge.pop(engine, None)

    def _observe(self, engine: Engine, record: Event) -> None:
        if isinstance(record, Hit):
            self.block_hits += num_blocks(record)
        elif isinstance(record, Store):
            self.block_stores += num_blocks(record)
            self._count_recomputes(engine, record)
        elif isinstance(record, Evict):
            self.block_evictions += num_blocks(record)
            self._remember_evicted(engine, record)
        elif isinstance(record, Pool):
            cached_free = record.num_cached_free or 0  # completed by the store: never None
            self.pool[engine] = (record.num_free, cached_free, record.num_in_use)
        elif isinstance(record, Arrive) and record.request_id is not None:
            tenant = _label(self._tenant_names, record.tenant, self.limits.tenants)
            self._tenants[record.request_id] = tenant
            if len(self._tenants) > self.limits.requests:
                self._tenants.popitem(last=False)
            self.in_flight[engine] += 1
        elif isinstance(record, Lookup) and not record.preempted:
            labels = (
                self._tenants.get(record.request_id or "", ""),
                _label(self._adapter_names, record.lora, self.limits.adapters),
            )
            self.query_tokens[labels] += record.num_prompt_tokens
            self.hit_tokens[labels] += record.num_hit_tokens
            self.requests[labels] += 1
        elif isinstance(record, Finish) and record.request_id is not None:
            self._tenants.pop(record.request_id, None)
            # A collector started again on a run sees finishes of requests it never saw arrive.
            self.in_flight[engine] = max(self.in_flight[engine] - 1, 0)
        elif isinstance(record, Collision):
            self.collisions += 1
        elif isinstance(record, Drop):
            self.missing_records += record.num_lost

    def _remember_evicted(self, engine: Engine, record: Evict) -> None:
        for block_hash in unpack_hashes(record):
            self._evicted[engine, block_hash] = None
            self._evicted.move_to_end((engine, block_hash))
        while len(self._evicted) > EVICTED_HASHES:
            self._evicted.popitem(last=False)

    def _count_recomputes(self, engine: Engine, record: Store) -> None:
        """A store of a hash this engine evicted: its prefix was computed again."""
        for block_hash in unpack_hashes(record):
            if (engine, block_hash) in self._evicted:
                del self._evicted[engine, block_hash]
                self.block_recomputes += 1


def _label(names: set[str], name: str | None, limit: int) -> str:
    """`name` as a label: itself while `names` (those given a label of their own so far) has
    room for it, else OTHER; "" for none."""
    if not name or name in names:
        return name or ""
    if len(names) < limit:
        names.add(name)
        return name
    return OTHER
