"""Running totals of a live run, kept by the receiver for the Prometheus exporter.

What it keeps is bounded by the collector's limits (`limits.py`), whatever the engines send:
past `tenants` tenant names and `adapters` LoRA adapter names, the rest are counted under
OTHER (so the series a scrape returns are bounded too); per engine and DP rank it keeps a
few numbers, and the receiver admits at most `engines` of them; the tenant of a request in
flight is remembered until its lookup, for at most `requests` requests (the oldest are
forgotten first: a request that never finishes does not stay).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
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
)
from engine_hooks.transport import BatchHeader

Labels = tuple[str, str]  # tenant, LoRA adapter ("" when unknown or none)
OTHER = "other"  # the label of the tenants and adapters past the limits


@dataclass
class LiveState:
    """What the exporter reports; `observe` is called with every stored batch."""

    limits: Limits = field(default_factory=Limits)
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
            tenant = _label(self._tenant_names, record.tenant, self.limits.tenants)
            self._tenants[record.request_id] = tenant
            if len(self._tenants) > self.limits.requests:
                self._tenants.popitem(last=False)
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
        elif isinstance(record, Collision):
            self.collisions += 1
        elif isinstance(record, Drop):
            self.missing_records += record.num_lost


def _label(names: set[str], name: str | None, limit: int) -> str:
    """`name` as a label: itself while `names` (those given a label of their own so far) has
    room for it, else OTHER; "" for none."""
    if not name or name in names:
        return name or ""
    if len(names) < limit:
        names.add(name)
        return name
    return OTHER
