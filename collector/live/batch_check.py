"""Checks on what arrives over the collector's socket, which it does not trust.

msgspec checks each field's type and bounds as it decodes (`engine_hooks.events`); what
spans fields is checked here: the header's count, the parallel per-block lists, and every
size, time and record number against the collector's own limits (`limits.py`), never the
sender's claims. Against what the run already holds (`check_sequence`): a batch whose
records the engine's stream has already passed (a duplicate, a replay, a batch overtaken
by a later one whose gap is already recorded) is refused, never stored twice. A message that
fails is rejected whole, counted by reason, and never stored or acknowledged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import msgspec
import numpy as np

from collector.live.limits import MAX_TS_NS, Limits
from collector.model.rejected_message import RejectedMessage
from engine_hooks.events import (
    COUNT_BYTES,
    HASH_BYTES,
    READABLE_WIRE_FORMATS,
    Allocate,
    Arrive,
    Collision,
    Drop,
    Event,
    Evict,
    Finish,
    FirstToken,
    Free,
    Hit,
    Lookup,
    Pool,
    Store,
    decoder,
    hash_width,
    num_blocks,
)
from engine_hooks.transport import BatchHeader

FRAMES_PER_MESSAGE = 3  # the engine's identity (added by ZMQ), the header, the records
# The fields of each kind of record that count tokens (or blocks of a request): at most
# `Limits.tokens` each.
_TOKEN_COUNTS: dict[type, tuple[str, ...]] = {
    Arrive: ("num_prompt_tokens",),
    Lookup: (
        "num_prompt_tokens",
        "num_hit_tokens",
        "num_hit_blocks",
        "longest_group_hit_tokens",
        "num_tier_hit_tokens",
    ),
    Finish: ("num_output_tokens",),
    FirstToken: ("num_tokens",),
    Store: ("block_size",),
}


@dataclass
class Rejections:
    """Messages rejected so far, by reason, and the last one's description."""

    by_reason: Counter[str] = field(default_factory=Counter)
    last: str = ""

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())

    def count(self, rejected: RejectedMessage) -> None:
        self.by_reason[rejected.reason] += 1
        self.last = str(rejected)


class BatchDecoder:
    """Turns a ROUTER message into (engine identity, header, records), or rejects it."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._header = msgspec.msgpack.Decoder(BatchHeader)
        self._records = decoder()

    def decode(self, frames: list[bytes]) -> tuple[bytes, BatchHeader, list[Event]]:
        if len(frames) != FRAMES_PER_MESSAGE:
            raise RejectedMessage("frames", f"{len(frames) - 1} frames, a batch has 2")
        identity, header_frame, records_frame = frames
        try:
            header = self._header.decode(header_frame)
            records = self._records.decode(records_frame)
        except msgspec.ValidationError as error:
            raise RejectedMessage("invalid", str(error)) from None
        except msgspec.DecodeError as error:
            raise RejectedMessage("undecodable", str(error)) from None
        check_batch(header, records, self.limits)
        return identity, header, records


def check_batch(header: BatchHeader, records: list[Event], limits: Limits) -> None:
    """What msgspec's per-field bounds cannot see: the stream's format is this collector's,
    the engine's pool is within `limits`, counts and packed columns agree, block ids lie in
    the pool, token counts and block positions within `limits.tokens`, reference counts fit
    their INTEGER column (none negative), records are numbered in order and their times (and
    an engine's stop, only in its closing batch) lie in [0, MAX_TS_NS)."""
    _check_header(header, records, limits)
    _check_order(records)
    packed_ids, packed_ref_cnts = _check_records(header, records, limits)
    block_ids = np.frombuffer(b"".join(packed_ids), dtype="<i4")
    if block_ids.size and not 0 <= block_ids.min() <= block_ids.max() < header.config.num_blocks:
        raise RejectedMessage(
            "invalid", f"a block id outside the engine's {header.config.num_blocks} blocks"
        )
    ref_cnts = np.frombuffer(b"".join(packed_ref_cnts), dtype="<i4")
    if ref_cnts.size and ref_cnts.min() < 0:
        raise RejectedMessage("invalid", "a negative reference count")


def _check_header(header: BatchHeader, records: list[Event], limits: Limits) -> None:
    if header.wire_format not in READABLE_WIRE_FORMATS:
        *others, last = sorted(READABLE_WIRE_FORMATS)
        readable = f"{', '.join(map(str, others))} and {last}" if others else str(last)
        raise RejectedMessage(
            "wire-format",
            f"the engine's hooks send wire format {header.wire_format}, this collector reads "
            f"{readable}: install the same kvscope beside the engine and the collector",
        )
    if header.num_records != len(records):
        raise RejectedMessage(
            "inconsistent", f"header says {header.num_records} records, {len(records)} came"
        )
    if header.stopped_ns and (records or header.stopped_ns >= MAX_TS_NS):
        raise RejectedMessage(
            "timestamp", "an engine's stop outside [0, 2^62) ns, or in a batch of records"
        )
    if header.config.num_blocks > limits.pool_blocks:
        raise RejectedMessage(
            "pool-blocks",
            f"engine {header.engine_id!r} claims a pool of {header.config.num_blocks:,} blocks, "
            f"over this collector's {limits.pool_blocks:,} (kvscope collect --limit "
            "pool-blocks=N)",
        )


def _check_order(records: list[Event]) -> None:
    if records:
        seqs = np.fromiter((record.seq for record in records), np.uint64, len(records))
        if len(records) > 1 and not (seqs[1:] > seqs[:-1]).all():
            raise RejectedMessage("out-of-order", "record numbers not increasing in a batch")
        times = np.fromiter((record.ts_ns for record in records), np.int64, len(records))
        if times.min() < 0 or times.max() >= MAX_TS_NS:
            raise RejectedMessage("timestamp", "a record time outside [0, 2^62) ns")


def _check_records(
    header: BatchHeader, records: list[Event], limits: Limits
) -> tuple[list[bytes], list[bytes]]:
    """Each record checked on its own; the packed block ids and reference counts of all."""
    packed_ids: list[bytes] = []
    packed_ref_cnts: list[bytes] = []
    num_groups = max(len(header.config.kv_groups), 1)
    for record in records:
        counts = [getattr(record, name) for name in _TOKEN_COUNTS.get(type(record), ())]
        if isinstance(record, Hit | Store):
            counts.append(record.first_position + num_blocks(record))
        if max(counts, default=0) > limits.tokens:
            raise RejectedMessage(
                "tokens",
                f"record {record.seq}: {max(counts):,} tokens or block positions, over this "
                f"collector's {limits.tokens:,} (kvscope collect --limit tokens=N)",
            )
        if isinstance(record, Hit | Allocate | Store | Evict | Free):
            problem = _block_columns_problem(record, num_groups)
            if problem:
                raise RejectedMessage("inconsistent", f"record {record.seq}: {problem}")
            packed_ids.append(record.block_ids)
            if isinstance(record, Free) and record.ref_cnts is not None:
                packed_ref_cnts.append(record.ref_cnts)
        elif isinstance(record, Collision):
            packed_ids.append(record.block_id.to_bytes(COUNT_BYTES, "little"))
        elif isinstance(record, Drop):
            raise RejectedMessage(
                "invalid", f"record {record.seq}: gaps are the collector's to record"
            )
        elif isinstance(record, Pool) and (
            record.num_free + record.num_in_use > header.config.num_blocks
            or len(record.num_in_use_by_group or ()) > num_groups
            or max(record.num_in_use_by_group or (0,)) > header.config.num_blocks
        ):
            raise RejectedMessage(
                "inconsistent",
                f"record {record.seq}: more blocks free and in use than the pool's "
                f"{header.config.num_blocks}, or in use by more groups than {num_groups}",
            )
    return packed_ids, packed_ref_cnts


def check_sequence(
    next_seq: int, header: BatchHeader, records: list[Event], limits: Limits
) -> None:
    """Against the engine's stream so far (`next_seq`: the number after the last record the
    run holds of it): the batch's records all come after it (else a duplicate or a replay,
    refused), and move it on by at most `limits.seq_jump` (a record numbered 2^63 - 1 is not a
    gap of nine quintillion lost records); the engine's own counts of records it lost are
    no more than it can have numbered."""
    if records and records[0].seq < next_seq:
        raise RejectedMessage(
            "replayed",
            f"engine {header.engine_id!r} rank {header.dp_rank}: record {records[0].seq:,} "
            f"again (the run holds its records up to {next_seq - 1:,})",
        )
    top = max(records[-1].seq + 1 if records else 0, header.next_seq, next_seq)
    if top - next_seq > limits.seq_jump:
        raise RejectedMessage(
            "seq-jump",
            f"engine {header.engine_id!r} rank {header.dp_rank}: record numbers jump from "
            f"{next_seq:,} to {top:,}, over this collector's {limits.seq_jump:,} (kvscope "
            "collect --limit seq-jump=N)",
        )
    if max(header.num_lost_in_engine, header.num_dropped_in_transport) > top + limits.seq_jump:
        raise RejectedMessage(
            "seq-jump",
            f"engine {header.engine_id!r} rank {header.dp_rank}: claims more records lost "
            f"than it has numbered ({top:,})",
        )


def _block_columns_problem(
    record: Hit | Allocate | Store | Evict | Free, num_groups: int
) -> str | None:
    """Why a block record's packed columns do not fit together (or its KV cache group is not
    one of the engine's), or None."""
    if len(record.block_ids) % COUNT_BYTES:
        return "block ids not packed 4 bytes each"
    if isinstance(record, Free | Evict):
        if record.kv_groups is not None:
            return "the groups of freed and evicted blocks are the collector's to name"
    elif record.kv_group >= num_groups:
        return f"KV cache group {record.kv_group} of an engine with {num_groups}"
    count = num_blocks(record)
    if isinstance(record, Free):
        if record.ref_cnts is not None and len(record.ref_cnts) != len(record.block_ids):
            return "per-block columns of different lengths"
        return None
    if isinstance(record, Allocate):
        return None
    width = hash_width(record)
    if width * count != len(record.block_hashes) or (count and not 8 <= width <= 64):
        return "block hashes not packed 8 to 64 bytes each, one per block"
    if isinstance(record, Store):
        lengths = {count}
        lengths |= {len(record.extra_keys)} if record.extra_keys is not None else set()
        lengths |= {len(record.token_ids)} if record.token_ids is not None else set()
        if len(lengths) != 1:
            return "per-block columns of different lengths"
        fingerprints = record.token_fingerprints
        if fingerprints is not None and len(fingerprints) != HASH_BYTES * count:
            return "token fingerprints not packed 8 bytes each, one per block"
    return None
