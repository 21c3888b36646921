"""A batch of engine records and its header, as the collector receives them live."""

from __future__ import annotations

from engine_hooks.events import (
    Arrive,
    Collision,
    Drop,
    Evict,
    Finish,
    Hit,
    Lookup,
    Pool,
    Store,
    pack_counts,
)
from engine_hooks.transport import BatchHeader, EngineSettings

# A pool of 31 blocks: 30 usable (the Pool record's 10 free and 20 in use) and the null block.
HEADER = BatchHeader("node-1", 0, 0, 0, 3, 5, EngineSettings(16, 31, "sha256", "0.34.0"))


RECORDS = [
    Arrive(0, 1, "a", 64, tenant="acme"),
    Lookup(1, 1, "a", 64, 32, 2, False, lora=None),
    Hit(2, 1, "a", pack_counts([4, 5]), b"hash-of4hash-of5"),
    Store(3, 1, "a", pack_counts([6, 7]), b"hash-of6hash-of7", b"hash-of5", 2, 16),
    Arrive(4, 2, "b", 48, tenant="acme"),
    Lookup(5, 2, "b", 48, 0, 0, False, lora="sql"),
    Lookup(6, 3, "a", 80, 64, 4, True),  # a resumed request: not counted as a new query
    Evict(7, 3, "b", pack_counts([6]), b"hash-of6"),
    Collision(8, 3, "b", 4, b"hash-of4", "a", b"f1", b"f2"),
    Pool(9, 4, None, 10, 4, 20),
    Finish(10, 5, "a", 8),
    Drop(11, 5, None, 2),
]
