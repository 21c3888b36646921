"""Checks on what arrives over the collector's socket, which it does not trust.

msgspec checks each field's type and bounds as it decodes (`engine_hooks.events`); what
spans fields is checked here: the header's count, the parallel per-block lists. A message
that fails is rejected whole, counted by reason, and never stored or acknowledged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import msgspec
import numpy as np

from engine_hooks.events import (
    COUNT_BYTES,
    WIRE_FORMAT,
    Allocate,
    Event,
    Evict,
    Free,
    Hit,
    Store,
    decoder,
    hash_width,
    num_blocks,
)
from engine_hooks.transport import BatchHeader

FRAMES_PER_MESSAGE = 3  # the engine's identity (added by ZMQ), the header, the records


class RejectedMessage(ValueError):
    """A message that is not a well-formed batch; `reason` is its class, for counting."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


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

    def __init__(self) -> None:
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
        check_batch(header, records)
        return identity, header, records


def check_batch(header: BatchHeader, records: list[Event]) -> None:
    """What msgspec's per-field bounds cannot see: the stream's format is this collector's,
    counts and packed columns agree, block ids lie in the engine's pool, and reference
    counts fit their INTEGER column (none negative)."""
    if header.wire_format != WIRE_FORMAT:
        raise RejectedMessage(
            "wire-format",
            f"the engine's hooks send wire format {header.wire_format}, this collector reads "
            f"{WIRE_FORMAT}: install the same kvscope beside the engine and the collector",
        )
    if header.num_records != len(records):
        raise RejectedMessage(
            "inconsistent", f"header says {header.num_records} records, {len(records)} came"
        )
    packed_ids: list[bytes] = []
    packed_ref_cnts: list[bytes] = []
    num_groups = max(len(header.config.kv_groups), 1)
    for record in records:
        if isinstance(record, Hit | Allocate | Store | Evict | Free):
            problem = _block_columns_problem(record, num_groups)
            if problem:
                raise RejectedMessage("inconsistent", f"record {record.seq}: {problem}")
            packed_ids.append(record.block_ids)
            if isinstance(record, Free) and record.ref_cnts is not None:
                packed_ref_cnts.append(record.ref_cnts)
    block_ids = np.frombuffer(b"".join(packed_ids), dtype="<i4")
    if block_ids.size and not 0 <= block_ids.min() <= block_ids.max() < header.config.num_blocks:
        raise RejectedMessage(
            "invalid", f"a block id outside the engine's {header.config.num_blocks} blocks"
        )
    ref_cnts = np.frombuffer(b"".join(packed_ref_cnts), dtype="<i4")
    if ref_cnts.size and ref_cnts.min() < 0:
        raise RejectedMessage("invalid", "a negative reference count")


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
    return None
