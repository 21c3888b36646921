"""Running totals of a live run, kept by the receiver for the Prometheus exporter."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

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
)
from engine_hooks.transport import BatchHeader

Labels = tuple[str, str]  # tenant, LoRA adapter ("" when unknown or none)


@dataclass
class LiveState:
    """What the exporter reports; `observe` is called with every stored batch."""

    query_tokens: Counter[Labels] = field(default_factory=Counter)
    hit_tokens: Counter[Labels] = field(default_factory=Counter)
    requests: Counter[Labels] = field(default_factory=Counter)
    block_hits: int = 0
    block_stores: int = 0
    block_evictions: int = 0
    collisions: int = 0
    missing_records: int = 0
    pool: dict[tuple[str, int], tuple[int, int, int]] = field(default_factory=dict)
    engine_dropped: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _tenants: dict[str, str] = field(default_factory=dict)

    def observe(self, header: BatchHeader, records: list[Event]) -> None:
        with self.lock:
            engine = (header.engine_id, header.dp_rank)
            self.engine_dropped[engine] = (
                header.num_lost_in_engine,
                header.num_dropped_in_transport,
            )
            for record in records:
                self._observe(engine, record)

    def _observe(self, engine: tuple[str, int], record: Event) -> None:
        if isinstance(record, Hit):
            self.block_hits += num_blocks(record)
        elif isinstance(record, Store):
            self.block_stores += num_blocks(record)
        elif isinstance(record, Evict):
            self.block_evictions += num_blocks(record)
        elif isinstance(record, Pool):
            cached_free = record.num_cached_free or 0  # completed by the store: never None
            self.pool[engine] = (record.num_free, cached_free, record.num_in_use)
        elif isinstance(record, Arrive) and record.request_id is not None:
            self._tenants[record.request_id] = record.tenant or ""
        elif isinstance(record, Lookup) and not record.preempted:
            labels = (self._tenants.get(record.request_id or "", ""), record.lora or "")
            self.query_tokens[labels] += record.num_prompt_tokens
            self.hit_tokens[labels] += record.num_hit_tokens
            self.requests[labels] += 1
        elif isinstance(record, Finish) and record.request_id is not None:
            self._tenants.pop(record.request_id, None)
        elif isinstance(record, Collision):
            self.collisions += 1
        elif isinstance(record, Drop):
            self.missing_records += record.num_lost
