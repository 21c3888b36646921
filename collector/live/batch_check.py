"""Checks on what arrives over the collector's socket, which it does not trust.

msgspec checks each field's type and bounds as it decodes (`engine_hooks.events`); what
spans fields is checked here: the header's count, the parallel per-block lists. A message
that fails is rejected whole, counted by reason, and never stored or acknowledged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import msgspec

from engine_hooks.events import Event, Evict, Free, Hit, Store, decoder
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
    """What msgspec's per-field bounds cannot see: counts and parallel lists agree."""
    if header.num_records != len(records):
        raise RejectedMessage(
            "inconsistent", f"header says {header.num_records} records, {len(records)} came"
        )
    for record in records:
        if isinstance(record, Hit | Evict | Store):
            lengths = {len(record.block_ids), len(record.block_hashes)}
            if isinstance(record, Store):
                lengths |= {len(record.extra_keys)} if record.extra_keys is not None else set()
                lengths |= {len(record.token_ids)} if record.token_ids is not None else set()
        elif isinstance(record, Free):
            lengths = {len(record.block_ids), len(record.ref_cnts)}
        else:
            continue
        if len(lengths) != 1:
            raise RejectedMessage(
                "inconsistent", f"record {record.seq}: per-block lists of different lengths"
            )
