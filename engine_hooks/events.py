"""The event records kvscope captures inside the engine: the wire format is the producer's.

Every record is a msgspec Struct in one tagged union (`Event`), encoded as a msgpack
array whose first element is the tag. Common fields come first (`seq`, `ts_ns`,
`request_id`), then the event's own fields, then the optional context fields
(`tenant`, `lora`, `engine_id`, `dp_rank`). The hooks leave `engine_id` and `dp_rank` at
their defaults; the collector names them from each batch's header.

Block records (hit, allocate, store, evict, free) describe one operation on one request and
carry one entry per block in parallel columns, packed: block ids (and a free's reference
counts, where the hooks send them) as little-endian int32 (`pack_counts`), block hashes as
the low 8 bytes of each, concatenated (`pack_hashes`: all the run file keeps of a hash, a
quarter of a SHA-256 one). So the engine encodes, and the collector decodes and stores, a
record's blocks as a few byte strings, not an object per block (a capture delivers millions
of block rows a minute); the collector stores one row per block. In a model with several KV
cache groups (hybrid: sliding-window or chunked-local layers beside full attention), a hit,
allocate or store names its group (`kv_group`, vLLM's group index); the collector names the
group of each freed or evicted block from its allocation (`kv_groups`).

Block hashes are vLLM's own hash bytes (`BlockHash`, without the group id suffix),
never Python `hash()` values. `seq` increases by one per record inside one engine:
a gap means records were lost (the hooks' buffer was full, or the transport could not
deliver them), and the collector that sees the gap stores a `Drop` record saying how many.

The field types carry bounds (`Count`, `BlockHash`, `Label`, ...): every value must fit its
run-file column and be safe to show. msgspec checks them when it decodes, that is in the
collector, which does not trust the socket; building and encoding records in the engine
checks nothing and costs nothing more.
"""

from __future__ import annotations

import struct
from typing import Annotated

import msgspec

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

Count = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
BigCount = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
Nanoseconds = Annotated[int, msgspec.Meta(ge=-INT64_MAX, le=INT64_MAX)]
TokenId = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
# vLLM's block hashes are 32 bytes (sha256) or 8 or 16 (xxhash); the run file keeps the
# low 64 bits.
BlockHash = Annotated[bytes, msgspec.Meta(min_length=8, max_length=64)]
Fingerprint = Annotated[bytes, msgspec.Meta(max_length=64)]
# Request ids, tenants, adapters, salts' pseudonyms, extra-key kinds: no control characters.
NO_CONTROL_CHARACTERS = r"^[^\x00-\x1f\x7f-\x9f]*\Z"  # \Z: "$" lets a final newline by
Label = Annotated[str, msgspec.Meta(max_length=256, pattern=NO_CONTROL_CHARACTERS)]
EngineId = Annotated[str, msgspec.Meta(max_length=128, pattern=r"^[A-Za-z0-9_.:@/+=-]*$")]
DpRank = Annotated[int, msgspec.Meta(ge=0, le=2**15 - 1)]
# Packed per-block columns: 4 bytes per block id or count; hashes at 8 to 64 bytes each (the
# hooks send 8; the collector checks that the widths and the counts agree, and keeps the low
# 64 bits of any width). A frame is at most 16 MiB anyway.
MAX_PACKED_BYTES = 16 << 20
PackedCounts = Annotated[bytes, msgspec.Meta(max_length=MAX_PACKED_BYTES)]
PackedHashes = Annotated[bytes, msgspec.Meta(max_length=MAX_PACKED_BYTES)]
COUNT_BYTES = 4
HASH_BYTES = 8  # of each block hash on the wire
GROUP_ID_BYTES = 4  # after the hash in vLLM's cache key (`BlockHashWithGroupId`)
# The record stream's meaning, as the collector must read it. 2: the hooks send evictions on
# reuse, cached-free counts and cleared counts as the collector's to derive (1: they sent
# them). 3: block records name their KV cache group, and a hit its first position. 4: a
# `Free` in a dense layout leaves its reference counts to the collector. 5: a `Lookup` says
# how many tokens a KV connector (an offload tier) supplied. 6: a `Store` may carry its blocks'
# key-free fingerprints (`token_fingerprints`). 7: a `FirstToken` says when a request's first
# output token came. A collector refuses a stream in a format it cannot read: another, but one
# whose records mean the same to it.
WIRE_FORMAT = 7
# 5's records are 6's without fingerprints (a run tells no key mismatch from them alone); 6's
# are 7's without first tokens (a run of them has no measured TTFT).
READABLE_WIRE_FORMATS = frozenset({5, 6, WIRE_FORMAT})


class _Context(msgspec.Struct, kw_only=True, array_like=True, tag_field="kind", gc=False):
    """Optional context carried by every record; kw_only keeps it at the end."""

    tenant: Label | None = None
    lora: Label | None = None
    engine_id: EngineId = ""
    dp_rank: DpRank = 0


class _Record(_Context, array_like=True, tag_field="kind", gc=False):
    """Fields every record starts with."""

    seq: BigCount
    ts_ns: Nanoseconds
    request_id: Label | None


class Arrive(_Record, tag="arrive"):
    """A request reached the engine (prompt length, keyed salt hash, opt-in token ids)."""

    num_prompt_tokens: Count
    salt_hash: Label | None = None
    token_ids: list[TokenId] | None = None


class Lookup(_Record, tag="lookup"):
    """A request's prefix was looked up when it was admitted (what PrefixCacheStats counts).

    `num_prompt_tokens` is every token looked up: the prompt, plus the output so far for a
    request resumed after preemption (`preempted`), as vLLM counts its queries. In a layout
    of several KV cache groups, the hit is the longest prefix every group can serve;
    `longest_group_hit_tokens` is the longest one group alone had cached when that was more
    (vLLM's shared-prefix boundary), else 0: the tokens between the two, another group (a
    sliding window's) cut off. `num_tier_hit_tokens` are the tokens after the GPU hit that
    vLLM's KV connector loaded instead (an offload tier's hit: vLLM's native CPU offloading,
    LMCache, ...), as the scheduler passed them to `allocate_slots`.
    """

    num_prompt_tokens: Count
    num_hit_tokens: Count
    num_hit_blocks: Count
    preempted: bool
    longest_group_hit_tokens: Count = 0
    num_tier_hit_tokens: Count = 0


class Hit(_Record, tag="hit"):
    """Cached blocks reused by a request in one KV cache group: the blocks of its prefix from
    `first_position` on (0 in a full-attention group; a sliding-window group reuses only the
    blocks its window still reads, and leaves the ones before as vLLM's null block)."""

    block_ids: PackedCounts
    block_hashes: PackedHashes
    first_position: Count = 0
    kv_group: Count = 0


class Allocate(_Record, tag="allocate"):
    """Blocks that left the free queue for a request's KV cache group `kv_group`."""

    block_ids: PackedCounts
    kv_group: Count = 0


class Store(_Record, tag="store"):
    """Full blocks whose hashes entered the prefix cache.

    Block i sits at position `first_position + i` of the request's block table; its parent is
    block i - 1, and the first block's parent is `parent_block_hash` (None at position 0).
    `extra_keys` names the kinds of extra hash keys per block (LoRA, cache salt, ...).
    `token_fingerprints`, packed as the hashes are (8 bytes a block), are the blocks' key-free
    fingerprints (engine_hooks/fingerprint.py): equal for the same tokens after the same
    prefix under any extra keys, on one engine; None with the fingerprints off.
    """

    block_ids: PackedCounts
    block_hashes: PackedHashes
    parent_block_hash: BlockHash | None
    first_position: Count
    block_size: Count
    extra_keys: list[tuple[Label, ...] | None] | None = None
    token_ids: list[list[TokenId]] | None = None
    kv_group: Count = 0
    token_fingerprints: PackedHashes | None = None


class Evict(_Record, tag="evict"):
    """Cached blocks whose hashes were dropped.

    The hooks send one only when something asks vLLM to evict blocks (`evict_blocks`). The
    common eviction, a cached free block handed out again, is an `Allocate` of a block the
    stream last left cached: the collector derives that `Evict` (`collector/store/
    cache_mirror.py`), so the engine keeps no per-block state for it. How long each block was
    cached and how often it was hit meanwhile follow from the same stream too.

    `kv_groups`, the KV cache group of each block, the collector fills from the blocks'
    allocations (the hooks send None: one call can evict blocks of several groups).
    """

    block_ids: PackedCounts
    block_hashes: PackedHashes
    kv_groups: PackedCounts | None = None


class Free(_Record, tag="free"):
    """Blocks a request released, with their reference counts after (0: back in the free
    queue, still cached if hashed). In a dense layout the hooks send `ref_cnts` as None and
    the collector counts them from the stream (an allocation sets a block's count to 1, a
    hit adds 1, a free takes 1); in any other they send vLLM's own, for vLLM changes counts
    there outside the hooked methods too (a Mamba group's copy-on-write). `kv_groups` as in
    `Evict`: the collector's to fill (vLLM frees a finished request's blocks of every group
    in one call)."""

    block_ids: PackedCounts
    ref_cnts: PackedCounts | None = None
    kv_groups: PackedCounts | None = None


class Collision(_Record, tag="collision"):
    """A block hash matched but the block's content did not: another prompt's KV was reused."""

    block_id: Count
    block_hash: BlockHash
    stored_by: Label | None
    stored_fingerprint: Fingerprint
    request_fingerprint: Fingerprint


class Reset(_Record, tag="reset"):
    """The whole prefix cache was cleared, dropping `num_cleared` cached blocks (counted by
    the collector from the stream: the hooks send None)."""

    num_cleared: Count | None


class Pool(_Record, tag="pool"):
    """Pool state after a scheduler step (the null block is not counted). vLLM counts the
    free and the in-use blocks; the cached ones among the free, and in a layout of several
    KV cache groups the blocks in use by each group, the collector counts from the stream
    (the hooks send None)."""

    num_free: Count
    num_cached_free: Count | None
    num_in_use: Count
    num_in_use_by_group: list[Count] | None = None


class Schedule(_Record, tag="schedule"):
    """A request was scheduled (first time, or again after a preemption)."""


class Preempt(_Record, tag="preempt"):
    """A running request was preempted and its blocks freed."""


class FirstToken(_Record, tag="first_token"):
    """A request's first output token came out of the engine (`Scheduler.update_from_output`
    gave it one). `num_tokens`: the prompt tokens the engine computed for it until then, every
    step's scheduled tokens summed (a recompute after a preemption counts again; a prefix hit
    is not computed). `age_ns`: the time since the request's arrival at vLLM's front end (its
    `arrival_time`, the one vLLM's own TTFT counts from), on the wall clock; None where the
    hooks do not know it (a replay: its arrival is its `Arrive`)."""

    num_tokens: Count
    age_ns: Nanoseconds | None = None


class Finish(_Record, tag="finish"):
    """A request finished and released its blocks."""

    num_output_tokens: Count


class Drop(_Record, tag="drop"):
    """`num_lost` records (a gap in `seq` starting at this record's own `seq`) never arrived."""

    num_lost: BigCount


Event = (
    Arrive
    | Lookup
    | Hit
    | Allocate
    | Store
    | Evict
    | Free
    | Collision
    | Reset
    | Pool
    | Schedule
    | Preempt
    | FirstToken
    | Finish
    | Drop
)

EVENT_TYPES: tuple[type[Event], ...] = (
    Arrive,
    Lookup,
    Hit,
    Allocate,
    Store,
    Evict,
    Free,
    Collision,
    Reset,
    Pool,
    Schedule,
    Preempt,
    FirstToken,
    Finish,
    Drop,
)

KIND_BY_TYPE: dict[type[Event], str] = {cls: str(cls.__struct_config__.tag) for cls in EVENT_TYPES}

EVENT_KINDS: tuple[str, ...] = tuple(KIND_BY_TYPE.values())


def pack_counts(values: list[int]) -> bytes:
    """Block ids or counts as a packed column (little-endian int32)."""
    return struct.pack(f"<{len(values)}i", *values)  # Python caches the compiled format


def pack_hashes(hashes: list[bytes]) -> bytes:
    """Block hashes as a packed column: the low 8 bytes of each (`hashes` share one width).

    One copy and one strided copy, in C; slicing each hash would build an object per block.
    """
    joined = b"".join(hashes)
    width = len(hashes[0]) if hashes else HASH_BYTES
    if width == HASH_BYTES:
        return joined
    if width % HASH_BYTES:  # not vLLM's (8, 16 or 32 bytes): one hash at a time
        return b"".join(block_hash[-HASH_BYTES:] for block_hash in hashes)
    step = width // HASH_BYTES
    return memoryview(joined).cast("Q")[step - 1 :: step].tobytes()


def pack_cache_keys(keys: list[bytes]) -> bytes:
    """vLLM's cache keys (a block hash, then its group id) packed as `pack_hashes` packs
    their hashes: the low 8 bytes of each hash."""
    return b"".join([key[-HASH_BYTES - GROUP_ID_BYTES : -GROUP_ID_BYTES] for key in keys])


def unpack_counts(packed: bytes) -> list[int]:
    """The values `pack_counts` packed."""
    return list(struct.unpack(f"<{len(packed) // COUNT_BYTES}i", packed))


def unpack_hashes(record: Hit | Store | Evict) -> list[bytes]:
    """The block hashes `pack_hashes` packed into a record, one per block."""
    width = hash_width(record)
    packed = record.block_hashes
    return [packed[index * width : (index + 1) * width] for index in range(num_blocks(record))]


def num_blocks(record: Hit | Allocate | Store | Evict | Free) -> int:
    return len(record.block_ids) // COUNT_BYTES


def hash_width(record: Hit | Store | Evict) -> int:
    """The bytes of each block hash a record carries (0 in a record without blocks; the
    collector checks that the width and the count agree)."""
    count = num_blocks(record)
    return len(record.block_hashes) // count if count else 0


def encoder() -> msgspec.msgpack.Encoder:
    """Return an encoder for lists of records."""
    return msgspec.msgpack.Encoder()


def decoder() -> msgspec.msgpack.Decoder[list[Event]]:
    """Return a decoder for lists of records."""
    return msgspec.msgpack.Decoder(list[Event])
