"""vLLM's KV event wire format (vllm/distributed/kv_events.py), decoded without importing vLLM.

An unmodified `vllm serve --kv-events-config ...` publishes multipart ZMQ messages
`[topic, 8-byte big-endian sequence number, msgpack(KVEventBatch)]`. The structs below mirror
vLLM 0.33's `KVEventBatch`, `BlockStored`, `BlockRemoved` and `AllBlocksCleared` field for
field (tests/test_vllm_kv_wire.py checks it against vLLM's own classes). Fields that older
vLLM versions lack have defaults, and fields newer ones add are ignored, so the collector
decodes other versions too. Importing vLLM would load torch (seconds); this module does not.

What arrives is untrusted, however well-formed: every value kvscope stores, shows or computes
with is held to the collector's own bounds as msgspec decodes it (a time that fits the run
file's nanoseconds, a DP rank, a block size and a KV cache group the engine's hooks would
also send, labels without control characters, token ids, hash widths, the length of every
list), and `check_batch` checks what spans fields (one extra-keys and one lookahead entry per
block, extra keys of vLLM's shapes, the block rows of a batch). Fields kvscope neither
stores nor shows (a session id, a locality) keep vLLM's types only, so an unusual value there
never costs a real batch. A batch that fails is refused whole (`RefusedBatch`).

Memory: a message is at most MAX_MESSAGE_BYTES, and what msgspec makes of it is bounded by its
types: at most 8 bytes an encoded byte for lists of small ints, about 20 for strings. Only
values typed `Any` could make an object of every byte (an empty list: 64 bytes for 1), so
none is: each block's extra keys stay encoded (`msgspec.Raw`, one object a block), and are
decoded one block at a time, at most MAX_KEYS_BYTES, to check their shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import msgspec

from collector.model.rejected_message import RejectedMessage
from engine_hooks.events import INT64_MAX, DpRank, TokenId
from engine_hooks.transport import MAX_KV_GROUPS

HASH64_MASK = (1 << 64) - 1

MEDIUM_GPU = "GPU"  # vLLM's name for the prefix cache's own pool (older vLLMs send no medium)

# Block hashes as vLLM publishes them: the low 64 bits as an int by default
# (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), the full hash bytes when that is 0.
# Ints are whatever msgpack holds (older vLLMs sent Python's signed hash()); bytes are vLLM's
# hash (32 for sha256, 16 or 8 for xxhash), the run file keeps each whole.
WireBlockHash = int | Annotated[bytes, msgspec.Meta(min_length=1, max_length=64)]

# The engine's wall clock in seconds: at or after 1970, and small enough that its nanoseconds
# fit the run file's BIGINT (the year 2262). NaN and infinities fail both bounds.
MAX_TS_S = INT64_MAX // 10**9
Timestamp = Annotated[float, msgspec.Meta(ge=0, le=MAX_TS_S)]
# Tokens per block: 0 in an offload tier's placeholder; the engine's hooks allow 2^20.
BlockSize = Annotated[int, msgspec.Meta(ge=0, le=1 << 20)]
GroupIndex = Annotated[int, msgspec.Meta(ge=0, lt=MAX_KV_GROUPS)]
# A medium or an adapter's name, stored and shown: no control characters, a trailing newline
# neither (`$` would let one through; `\Z` does not).
Label = Annotated[str, msgspec.Meta(max_length=256, pattern=r"^[^\x00-\x1f\x7f-\x9f]*\Z")]
# The largest message the subscriber takes (ZMQ drops a larger one before anything is
# decoded, as the engines' socket does): a step of about 3 million token ids.
MAX_MESSAGE_BYTES = 16 << 20
# Block rows one batch may make (and events, blocks of an event, extra-keys and lookahead
# entries): a step of 4 million tokens in 16-token blocks.
MAX_BLOCKS_PER_BATCH = 1 << 18
Rows = msgspec.Meta(max_length=MAX_BLOCKS_PER_BATCH)
# Token ids of one event: those of one request's blocks, as many as kvscope's traces allow.
Tokens = Annotated[list[TokenId], msgspec.Meta(max_length=1 << 24)]
# One block's extra keys as vLLM publishes them: LoRA names and cache salts (str),
# (mm_identifier, offset) pairs, prompt-embeds digests (bytes); kvscope counts and digests
# them, never stores them. msgspec cannot type a union of str and bytes: see `_keys_problem`.
EXTRA_KEY_SCALARS = (str, bytes, int)
MAX_KEYS_BYTES = 1 << 16  # of one block's extra keys, encoded
NIL = b"\xc0"  # msgpack's None: a block without extra keys


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Full blocks entered the prefix cache (or, in "full" report mode, were reused)."""

    block_hashes: Annotated[list[WireBlockHash], Rows]
    parent_block_hash: WireBlockHash | None = None
    token_ids: Tokens = msgspec.field(default_factory=list)
    block_size: BlockSize = 0
    lora_id: int | None = None
    medium: Label | None = None
    lora_name: Label | None = None
    extra_keys: Annotated[list[msgspec.Raw], Rows] | None = None  # `block_extra_keys`
    group_idx: GroupIndex | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: Annotated[list[Tokens], Rows] | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Block hashes left the prefix cache (evicted, promoted, or reset one by one)."""

    block_hashes: Annotated[list[WireBlockHash], Rows]
    medium: Label | None = None
    group_idx: GroupIndex | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """The whole prefix cache was reset."""


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One engine step's events: vLLM's wall-clock time (s), the events, its DP rank."""

    ts: Timestamp
    events: Annotated[list[WireEvent], Rows]
    data_parallel_rank: DpRank | None = None


_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


class RefusedBatch(RejectedMessage):
    """A payload that is not a batch this collector stores; `reason` is its class, for
    counting: undecodable (not a KVEventBatch), invalid (a value of the wrong type or past a
    bound), inconsistent (fields that do not agree), too-large (too many blocks), restarts
    (a publisher restarting past what a run counts)."""


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode and check one message payload; raises `RefusedBatch` on anything else."""
    try:
        batch = _DECODER.decode(payload)
    except msgspec.ValidationError as error:
        raise RefusedBatch("invalid", str(error)) from None
    except msgspec.DecodeError as error:
        raise RefusedBatch("undecodable", str(error)) from None
    except RecursionError:  # arrays in arrays, thousands deep, in extra keys (msgspec skips
        # over a Raw value by recursing into it)
        raise RefusedBatch("undecodable", "values nested too deeply") from None
    check_batch(batch)
    return batch


def check_batch(batch: KVEventBatch) -> None:
    """What msgspec's per-field bounds cannot see: extra keys of vLLM's shapes, per-block
    lists with one entry per block (the conflict check reads them by position), and at most
    MAX_BLOCKS_PER_BATCH block rows."""
    rows = num_rows(batch)
    if rows > MAX_BLOCKS_PER_BATCH:
        raise RefusedBatch(
            "too-large", f"{rows:,} block rows in one batch, at most {MAX_BLOCKS_PER_BATCH:,}"
        )
    for index, event in enumerate(batch.events):
        if not isinstance(event, BlockStored):
            continue
        count = len(event.block_hashes)
        for name in ("extra_keys", "lookahead_token_ids"):
            entries = getattr(event, name)
            if entries is not None and len(entries) != count:
                raise RefusedBatch(
                    "inconsistent", f"event {index}: {len(entries)} {name} for {count} blocks"
                )
        for keys in event.extra_keys or ():
            problem = _keys_problem(keys)
            if problem:
                raise RefusedBatch("invalid", f"event {index}: {problem}")


def num_rows(batch: KVEventBatch) -> int:
    """The rows a batch makes in vllm_kv_events: one per block, one per cache clear."""
    return sum(
        1 if isinstance(event, AllBlocksCleared) else len(event.block_hashes)
        for event in batch.events
    )


def _keys_problem(keys: msgspec.Raw) -> str | None:
    """Why one block's encoded extra keys are not vLLM's shape (none, or a list of strings,
    bytes, integers or lists of them), or None. Decoded alone, at most MAX_KEYS_BYTES."""
    if len(keys) > MAX_KEYS_BYTES:
        return f"{len(keys):,} bytes of extra keys for one block, at most {MAX_KEYS_BYTES:,}"
    try:
        decoded = msgspec.msgpack.decode(keys)
    except RecursionError:
        return "extra keys nested too deeply"
    if decoded is None:
        return None
    if isinstance(decoded, list) and all(map(_is_extra_key, decoded)):
        return None
    return "extra keys that are not a list of strings, bytes, integers or lists of them"


def block_extra_keys(event: BlockStored, position: int) -> msgspec.Raw | None:
    """The encoded extra keys of the event's block at `position`, None when it has none."""
    if event.extra_keys is None or position >= len(event.extra_keys):
        return None
    keys = event.extra_keys[position]
    return None if memoryview(keys) == NIL else keys


def num_extra_keys(keys: msgspec.Raw) -> int:
    """How many extra keys a block's encoded list holds, from the list's msgpack header."""
    data = memoryview(keys)[:5].tobytes()  # checked: a list (`_keys_problem`)
    if 0x90 <= data[0] <= 0x9F:
        return data[0] & 0x0F
    return int.from_bytes(data[1:3] if data[0] == 0xDC else data[1:5], "big")


def _is_extra_key(key: object) -> bool:
    if isinstance(key, list):
        return all(isinstance(part, EXTRA_KEY_SCALARS) for part in key)
    return isinstance(key, EXTRA_KEY_SCALARS)


def hash64(block_hash: WireBlockHash) -> int:
    """The 64-bit form of a published hash, as vLLM makes it: the low 64 bits, big-endian."""
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash[-8:], "big")
    return block_hash & HASH64_MASK


@dataclass(frozen=True)
class ReceivedBatch:
    """A batch as the subscriber got it: which stream, its sequence number, live or replayed.

    `epoch` counts publisher restarts seen on this endpoint (vLLM's numbers restart at 0).
    """

    endpoint: str
    epoch: int
    seq: int
    batch: KVEventBatch
    replayed: bool


@dataclass(frozen=True)
class Gap:
    """Batches `first_seq`..`last_seq` (inclusive) that never arrived, and why."""

    endpoint: str
    epoch: int
    dp_rank: int | None
    first_seq: int
    last_seq: int
    reason: str
    detected_ns: int

    @property
    def num_batches(self) -> int:
        return self.last_seq - self.first_seq + 1


def describes_each_block(event: BlockStored) -> bool:
    """Whether a BlockStored's tokens are its blocks' own, block after block. A hybrid model's
    sliding-window group stores only the blocks its window can reuse: vLLM then publishes the
    hashes of those (none, at times) with the tokens of the whole range, so which tokens and
    which parent go with which hash, the event does not say."""
    return len(event.token_ids) == len(event.block_hashes) * event.block_size
