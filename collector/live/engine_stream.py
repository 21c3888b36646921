"""One engine's stream of records as the receiver takes it in (collector/live/receiver.py):
where its record numbers stand, and the records each batch leaves missing."""

from __future__ import annotations

from dataclasses import dataclass

from engine_hooks.events import Drop, Event
from engine_hooks.transport import BatchHeader


@dataclass
class EngineStream:
    next_seq: int = 0
    last_ts_ns: int = 0  # the newest record's time: a drop found at a stream's end has it
    num_blocks: int | None = None  # the engine's pool, once a batch of this run named it
    capture_stopped: str = ""  # why the engine's hooks stopped capturing, once noted
    settings_kept: bool = False  # its settings in the run (announced.py), once per collector


def named_with_gaps(stream: EngineStream, records: list[Event], header: BatchHeader) -> list[Drop]:
    """Name each record's engine from the batch's header (the hooks leave it out: less to
    encode in the engine), and return Drop records for every jump in `seq` (and, from the
    engine's closing batch, for records missing at the end), updating the stream."""
    drops: list[Drop] = []

    def missing(up_to: int, ts_ns: int) -> None:
        drops.append(
            Drop(
                stream.next_seq,
                ts_ns,
                None,
                up_to - stream.next_seq,
                engine_id=header.engine_id,
                dp_rank=header.dp_rank,
            )
        )

    for record in records:
        record.engine_id = header.engine_id
        record.dp_rank = header.dp_rank
        if record.seq > stream.next_seq:
            missing(record.seq, record.ts_ns)
        stream.next_seq = max(stream.next_seq, record.seq + 1)
        stream.last_ts_ns = record.ts_ns
    if header.next_seq > stream.next_seq:
        missing(header.next_seq, stream.last_ts_ns)
        stream.next_seq = header.next_seq
    return drops
