"""A seeded stream of well-formed messages with hostile values, each at or past one of the
collector's bounds, and what the collector must make of each: stored whole, or refused for
one named reason. The model keeps what the collector's rules say of each engine (its pool,
its next record number) and so knows, message by message, which values are still in bounds.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from collector.live.limits import MAX_TS_NS, Limits
from engine_hooks.events import (
    INT32_MAX,
    INT64_MAX,
    Allocate,
    Arrive,
    Collision,
    Drop,
    Event,
    Finish,
    FirstToken,
    Free,
    Hit,
    Lookup,
    Pool,
    Preempt,
    Reset,
    Schedule,
    Store,
    pack_counts,
)
from tests.support.hostile import encode, frames, header

Engine = tuple[str, int]

# Small limits, so that every bound is reached many times in a few thousand messages.
LIMITS = Limits(
    engines=6,
    pool_blocks=5_000,
    total_pool_blocks=12_000,
    seq_jump=1_000,
    tenants=3,
    adapters=2,
    requests=50,
)
ENGINE_IDS = [f"engine-{index}" for index in range(5)]
DP_RANKS = [0, 1, 32_767]  # the highest DP rank the wire allows
NAMES = ["a" * 256, "b", "c", "d", "e" * 255 + "f", None]  # 256 characters: the longest


def limit_args(limits: Limits) -> list[str]:
    """`kvscope collect` arguments that set these limits."""
    return [
        argument
        for name in Limits.names()
        for argument in ("--limit", f"{name}={getattr(limits, name.replace('-', '_'))}")
    ]


@dataclass
class Stream:
    pool: int
    next_seq: int = 0


@dataclass
class Expected:
    """What a run must hold once the collector has taken the messages."""

    keys: set[tuple[str, int, int]] = field(default_factory=set)  # engine, rank, record
    event_rows: int = 0  # rows of events, but the collector's own drops and evictions
    pool_rows: int = 0
    collision_rows: int = 0
    drops: list[int] = field(default_factory=list)  # each gap's missing records
    rejected: Counter[str] = field(default_factory=Counter)


class HostileStream:
    """Messages, made one at a time, with the outcome each must have."""

    def __init__(self, seed: int, limits: Limits = LIMITS) -> None:
        self.rng = random.Random(seed)
        self.limits = limits
        self.streams: dict[Engine, Stream] = {}
        self.pool_total = 0
        self.expected = Expected()
        self.replayable: list[list[bytes]] = []  # stored messages with records
        self.batch_seq = 0  # each message's own, so that an acknowledgement names it
        self.last_stored = -1  # the batch_seq of the last message stored

    # -- the messages ---------------------------------------------------------------------

    def message(self) -> list[bytes]:
        """One more message; its outcome is added to `expected`."""
        self.batch_seq += 1
        roll = self.rng.random()
        if not self.streams or roll < 0.06:
            return self._new_engine()
        if roll < 0.6:
            return self._valid(self._admitted())
        attack: Callable[[], tuple[list[bytes], str]] = self.rng.choice(self._attacks())
        message, reason = attack()
        self.expected.rejected[reason] += 1
        return message

    def closing(self) -> list[bytes]:
        """A valid message that is stored (to wait for: its acknowledgement)."""
        self.batch_seq += 1
        return self._valid(self._admitted())

    def _admitted(self) -> Engine:
        return self.rng.choice(sorted(self.streams))

    def _new_engine(self) -> list[bytes]:
        rng = self.rng
        engine = (rng.choice(ENGINE_IDS), rng.choice(DP_RANKS))
        while engine in self.streams:
            engine = (f"engine-{rng.randrange(10**6)}", rng.choice(DP_RANKS))
        largest = self.limits.pool_blocks  # half the engines: the largest pool there may be
        pool = rng.choice([largest, largest, largest, 0, 1, rng.randint(1, largest)])
        room = self.limits.total_pool_blocks - self.pool_total
        if len(self.streams) >= self.limits.engines or pool > room:
            reason = "engines" if len(self.streams) >= self.limits.engines else "total-pool-blocks"
            self.expected.rejected[reason] += 1
            records = self._records(Stream(pool), 0)
            return self._frames(engine, pool, records)
        self.streams[engine] = Stream(pool)
        self.pool_total += pool
        return self._valid(engine)

    def _valid(self, engine: Engine) -> list[bytes]:
        """A batch within every bound: stored, and the model's stream moved on."""
        stream = self.streams[engine]
        rng = self.rng
        if rng.random() < 0.05:  # a closing batch: no records, the engine's next number
            next_seq = stream.next_seq + rng.choice([0, 1, self.limits.seq_jump])
            self._gap(stream, next_seq)
            self.last_stored = self.batch_seq
            stopped_ns = rng.choice([0, 0, MAX_TS_NS - 1, rng.randrange(MAX_TS_NS)])
            return self._frames(engine, stream.pool, [], next_seq=next_seq, stopped_ns=stopped_ns)
        first = stream.next_seq + rng.choice([0, 0, 0, 1, rng.randrange(self.limits.seq_jump)])
        records = self._records(stream, first)
        if records[-1].seq + 1 - stream.next_seq > self.limits.seq_jump:
            records = self._records(stream, stream.next_seq)
        if rng.random() < 0.05:  # exactly the longest jump a batch may make
            records = self._records(stream, stream.next_seq + self.limits.seq_jump - 1, count=1)
        self._gap(stream, records[0].seq)
        for record in records:
            self._gap(stream, record.seq)
            stream.next_seq = record.seq + 1
            self._expect_stored(engine, record)
        message = self._frames(engine, stream.pool, records)
        self.replayable.append(message)
        self.last_stored = self.batch_seq
        return message

    def _gap(self, stream: Stream, up_to: int) -> None:
        if up_to > stream.next_seq:
            self.expected.drops.append(up_to - stream.next_seq)
            stream.next_seq = up_to

    def _expect_stored(self, engine: Engine, record: Event) -> None:
        expected = self.expected
        expected.keys.add((*engine, record.seq))
        if isinstance(record, Pool):
            expected.pool_rows += 1
        elif isinstance(record, Collision):
            expected.collision_rows += 1
        elif isinstance(record, Hit | Allocate | Store | Free):
            expected.event_rows += len(record.block_ids) // 4
        else:
            expected.event_rows += 1

    def _frames(
        self, engine: Engine, pool: int, records: list[Event], **changes: object
    ) -> list[bytes]:
        fields: dict[str, object] = {"dp_rank": engine[1], **changes}
        batch_header = header(
            engine[0], records, batch_seq=self.batch_seq, num_blocks=pool, **fields
        )
        return frames(batch_header, records)

    # -- records within every bound -------------------------------------------------------

    def _records(self, stream: Stream, first: int, count: int | None = None) -> list[Event]:
        rng = self.rng
        seq = first
        records: list[Event] = []
        for _ in range(count or rng.randint(1, 12)):
            records.append(self._record(stream.pool, seq))
            seq += rng.choice([1, 1, 1, 1, 2, 7])
        return records

    def _record(self, pool: int, seq: int) -> Event:
        rng = self.rng
        ts = rng.choice([0, 1, MAX_TS_NS - 1, rng.randrange(MAX_TS_NS)])
        request = rng.choice(NAMES)
        tokens = self.limits.tokens
        count = rng.choice([0, 1, tokens, rng.randrange(tokens)])
        kinds = [
            "arrive",
            "lookup",
            "schedule",
            "preempt",
            "first_token",
            "finish",
            "reset",
            "pool",
        ]
        if pool:
            kinds += ["allocate", "store", "hit", "free", "collision"] * 2
        kind = rng.choice(kinds)
        if kind == "arrive":
            tenant, lora = rng.choice(NAMES), rng.choice(NAMES)
            return Arrive(seq, ts, request, count, tenant=tenant, lora=lora)
        if kind == "lookup":
            return Lookup(seq, ts, request, count, count, count, False, count, count)
        if kind == "schedule":
            return Schedule(seq, ts, request)
        if kind == "preempt":
            return Preempt(seq, ts, request)
        if kind == "first_token":
            return FirstToken(seq, ts, request, count, rng.choice([None, 0, ts, -ts]))
        if kind == "finish":
            return Finish(seq, ts, request, count)
        if kind == "reset":
            return Reset(seq, ts, None, None)
        if kind == "pool":
            free = rng.randint(0, pool)
            return Pool(seq, ts, None, free, None, rng.randint(0, pool - free))
        block_ids = [
            rng.choice([0, pool - 1, rng.randrange(pool)]) for _ in range(rng.randint(1, 6))
        ]
        ids = pack_counts(block_ids)
        width = rng.choice([8, 32, 64])
        hashes = rng.randbytes(width * len(block_ids))
        position = rng.choice([0, tokens - len(block_ids), rng.randrange(tokens - 6)])
        if kind == "allocate":
            return Allocate(seq, ts, request, ids)
        if kind == "store":
            parent = rng.choice([None, rng.randbytes(8), rng.randbytes(64)])
            keys = rng.choice([None, [("lora",) for _ in block_ids]])
            fingerprints = rng.choice([None, rng.randbytes(8 * len(block_ids))])
            return Store(
                seq,
                ts,
                request,
                ids,
                hashes,
                parent,
                position,
                count,
                extra_keys=keys,
                token_fingerprints=fingerprints,
            )
        if kind == "hit":
            return Hit(seq, ts, request, ids, hashes, position)
        if kind == "free":
            counts = rng.choice(
                [None, pack_counts([rng.choice([0, 1, INT32_MAX]) for _ in block_ids])]
            )  # a reference count is no token count: any 32-bit one
            return Free(seq, ts, request, ids, counts)
        return Collision(seq, ts, request, block_ids[0], hashes[:width], request, b"", b"\x01" * 64)

    # -- attacks: each refused for the reason it returns ------------------------------------

    def _attacks(self) -> list[Callable[[], tuple[list[bytes], str]]]:
        return [
            self._pool_claim,
            self._block_past_pool,
            self._time_out_of_range,
            self._value_past_its_type,
            self._replay,
            self._overlap,
            self._seq_jump,
            self._out_of_order,
            self._pool_changed,
            self._inconsistent,
            self._drop_record,
            self._too_many_tokens,
        ]

    def _hostile(self, engine: Engine, records: list[Event], **changes: object) -> list[bytes]:
        return self._frames(engine, self.streams[engine].pool, records, **changes)

    def _pool_claim(self) -> tuple[list[bytes], str]:
        """A pool past the collector's limit, with a block near its end (the 115-byte bomb)."""
        pool = self.rng.choice([self.limits.pool_blocks + 1, INT32_MAX])
        engine = (self.rng.choice(ENGINE_IDS), 0)
        records: list[Event] = [Allocate(0, 1, "r", pack_counts([pool - 1]))]
        return self._frames(engine, pool, records), "pool-blocks"

    def _block_past_pool(self) -> tuple[list[bytes], str]:
        engine = self._admitted()
        stream = self.streams[engine]
        seq = stream.next_seq
        block = stream.pool + self.rng.choice([0, 1, 1_000_000])
        record: Event = self.rng.choice(
            [
                Allocate(seq, 1, "r", pack_counts([block])),
                Collision(seq, 1, "r", block, b"\x01" * 8, None, b"", b""),
            ]
        )
        return self._hostile(engine, [record]), "invalid"

    def _time_out_of_range(self) -> tuple[list[bytes], str]:
        """A record's time out of range, an engine's stop out of range in its closing batch,
        or a stop in a batch of records."""
        engine = self._admitted()
        seq = self.streams[engine].next_seq
        choice = self.rng.randrange(3)
        if choice == 1:
            stopped_ns = self.rng.choice([MAX_TS_NS, INT64_MAX])
            return self._hostile(engine, [], next_seq=seq, stopped_ns=stopped_ns), "timestamp"
        if choice == 2:
            return self._hostile(engine, [Schedule(seq, 1, "r")], stopped_ns=1), "timestamp"
        ts = self.rng.choice([-1, MAX_TS_NS, INT64_MAX, -INT64_MAX])
        return self._hostile(engine, [Schedule(seq, ts, "r")]), "timestamp"

    def _value_past_its_type(self) -> tuple[list[bytes], str]:
        """One value one past what its field allows: msgspec refuses it as it decodes."""
        engine = self._admitted()
        seq = self.streams[engine].next_seq
        choice = self.rng.randrange(6)
        records: list[Event] = [
            [Arrive(seq, 1, "r", INT32_MAX + 1)],
            [Arrive(seq, 1, "r", 1, tenant="t" * 257)],
            [Schedule(INT64_MAX + 1, 1, "r")],
            [Schedule(seq, INT64_MAX + 1, "r")],
            [Hit(seq, 1, "r", pack_counts([0]), b"\x01" * 8, INT32_MAX + 1)],
            [Schedule(seq, 1, "r")],
        ][choice]
        changes = {"dp_rank": 32_768} if choice == 5 else {}
        return self._hostile(engine, records, **changes), "invalid"

    def _replay(self) -> tuple[list[bytes], str]:
        """A batch the run holds already, sent again byte for byte."""
        if not self.replayable:
            return self._overlap()
        return self.rng.choice(self.replayable), "replayed"

    def _overlap(self) -> tuple[list[bytes], str]:
        """A batch whose first record the run holds already (an overtaken batch's, too)."""
        engine = self._admitted()
        stream = self.streams[engine]
        if stream.next_seq == 0:
            return self._seq_jump()
        first = self.rng.choice([0, stream.next_seq - 1])
        return self._hostile(engine, self._records(stream, first)), "replayed"

    def _seq_jump(self) -> tuple[list[bytes], str]:
        engine = self._admitted()
        next_seq = self.streams[engine].next_seq
        past = next_seq + self.limits.seq_jump
        choice = self.rng.randrange(4)
        if choice == 0:  # a record one past the longest jump, or numbered 2^63 - 1
            seq = self.rng.choice([past, INT64_MAX])
            return self._hostile(engine, [Schedule(seq, 1, "r")]), "seq-jump"
        if choice == 1:  # a closing batch that says the engine numbered that many
            return self._hostile(engine, [], next_seq=self.rng.choice([past + 1, INT64_MAX])), (
                "seq-jump"
            )
        lost = {"num_lost_in_engine" if choice == 2 else "num_dropped_in_transport": INT64_MAX}
        return self._hostile(engine, [Schedule(next_seq, 1, "r")], **lost), "seq-jump"

    def _out_of_order(self) -> tuple[list[bytes], str]:
        engine = self._admitted()
        seq = self.streams[engine].next_seq
        second = self.rng.choice([seq, seq + 1])  # the same number twice, or one before
        records: list[Event] = [Schedule(seq + 1, 1, "r"), Schedule(second, 1, "r")]
        return self._hostile(engine, records), "out-of-order"

    def _pool_changed(self) -> tuple[list[bytes], str]:
        engine = self._admitted()
        stream = self.streams[engine]
        pool = stream.pool + 1 if stream.pool < self.limits.pool_blocks else stream.pool - 1
        records: list[Event] = [Schedule(stream.next_seq, 1, "r")]
        return self._frames(engine, pool, records), "inconsistent"

    def _inconsistent(self) -> tuple[list[bytes], str]:
        """Values each within its type, that do not fit together or with the engine's pool."""
        engine = self._admitted()
        stream = self.streams[engine]
        seq = stream.next_seq
        records: list[Event] = self.rng.choice(
            [
                [Pool(seq, 1, None, stream.pool + 1, None, 0)],
                [Pool(seq, 1, None, stream.pool, None, 1)],
                [Hit(seq, 1, "r", pack_counts([0]), b"\x01" * 65)],
                # key-free fingerprints not 8 bytes a block
                [
                    Store(
                        seq, 1, "r", pack_counts([0]), b"\x01" * 8, None, 0, 16, None, None, 0, b""
                    )
                ],
                [
                    Store(
                        seq,
                        1,
                        "r",
                        pack_counts([0]),
                        b"\x01" * 8,
                        None,
                        0,
                        16,
                        None,
                        None,
                        0,
                        b"\x01" * 9,
                    )
                ],
            ]
        )
        if stream.pool == 0 and not isinstance(records[0], Pool):
            records = [Pool(seq, 1, None, 1, None, 0)]
        message = self._hostile(engine, records)
        if self.rng.random() < 0.2:  # a header that counts its records wrong
            message = [encode(header(engine[0], records * 2, dp_rank=engine[1])), message[1]]
        return message, "inconsistent"

    def _drop_record(self) -> tuple[list[bytes], str]:
        engine = self._admitted()
        record = Drop(self.streams[engine].next_seq, 1, None, INT64_MAX)
        return self._hostile(engine, [record]), "invalid"

    def _too_many_tokens(self) -> tuple[list[bytes], str]:
        """A token count or block position one past the limit, or at the largest 32 bits
        hold: each fits its field, not the collector's limit."""
        engine = self._admitted()
        seq = self.streams[engine].next_seq
        count = self.rng.choice([self.limits.tokens + 1, INT32_MAX])
        block = pack_counts([0])
        record: Event = self.rng.choice(
            [
                Arrive(seq, 1, "r", count),
                Lookup(seq, 1, "r", 1, 0, 0, False, 0, count),
                Finish(seq, 1, "r", count),
                FirstToken(seq, 1, "r", count, None),
                Store(seq, 1, "r", block, b"\x01" * 8, None, 0, count),
                Store(seq, 1, "r", block, b"\x01" * 8, None, count, 16),
                Hit(seq, 1, "r", block, b"\x01" * 8, count),
            ]
        )
        if self.streams[engine].pool == 0:
            record = Finish(seq, 1, "r", count)
        return self._hostile(engine, [record]), "tokens"
