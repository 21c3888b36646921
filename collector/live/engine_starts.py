"""Each engine start a run holds. The hooks send when they started (`BatchHeader.started_ns`):
an engine id and DP rank that start again (KVSCOPE_ENGINE_ID kept across restarts of vLLM)
number their records from 0 again, so the collector takes the new start as another engine of
the run, named "ID #2" (then #3, ...), as a restart under a new id (host:pid) is; a batch one
start sent twice is still refused as replayed (batch_check.py)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from engine_hooks.events import Event
from engine_hooks.transport import BatchHeader

Engine = tuple[str, int]  # engine id, DP rank


class EngineStarts:
    """(engine id, DP rank, started_ns) as the hooks sent them -> the run's engine id, and
    the start each of the run's engines holds."""

    def __init__(self) -> None:
        self._names: dict[tuple[str, int, int], str] = {}
        self._held: dict[Engine, int] = {}  # the run's engine -> its start's started_ns

    def resume(self, kept: list[tuple[Engine, tuple[str, int]]]) -> None:
        """The starts a run kept (announced.kept_starts), for a collector resuming it."""
        for (engine_id, dp_rank), (announced_id, started_ns) in kept:
            self._names[(announced_id, dp_rank, started_ns)] = engine_id
            self._held[(engine_id, dp_rank)] = started_ns

    def named(
        self, header: BatchHeader, records: list[Event], next_seq: Callable[[Engine], int | None]
    ) -> BatchHeader:
        """The header under the run's name of the start that sent it. `next_seq`: the number
        after the last record the run holds of an engine, None for an engine it has not."""
        if not header.started_ns:
            return header  # hooks from before starts were sent: one start per engine id
        named = self._names.get((header.engine_id, header.dp_rank, header.started_ns))
        if named is not None:
            return msgspec.structs.replace(header, engine_id=named)
        engine = (header.engine_id, header.dp_rank)
        held = next_seq(engine)
        if held is None:
            return header  # the engine's first start in this run
        if engine not in self._held and (not records or records[0].seq >= held):
            return header  # a run from before starts were kept, going on where it stopped
        number = 2
        while next_seq((f"{header.engine_id} #{number}", header.dp_rank)) is not None:
            number += 1  # bounded: each name taken is one of the run's engines (its limit)
        return msgspec.structs.replace(header, engine_id=f"{header.engine_id} #{number}")

    def admitted(self, sent: BatchHeader, header: BatchHeader) -> None:
        """A batch `sent` by the hooks was admitted as `header` (named): its start is that
        engine of the run from now on."""
        if sent.started_ns:
            self._names[(sent.engine_id, sent.dp_rank, sent.started_ns)] = header.engine_id
            self._held.setdefault((header.engine_id, header.dp_rank), sent.started_ns)
