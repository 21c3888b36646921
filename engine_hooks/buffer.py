"""The bounded buffer between the hooks (producer) and whoever drains them (consumer)."""

from __future__ import annotations

import threading

from engine_hooks.events import Event

DEFAULT_CAPACITY = 2_000_000


class EventBuffer:
    """A bounded list of records: `offer` never blocks, `take` hands the whole list over.

    A batch that does not fit is refused whole and the producer counts it as lost.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._records: list[Event] = []
        self._lock = threading.Lock()

    def offer(self, records: list[Event]) -> bool:
        """Append `records` if they all fit; return whether they were accepted."""
        with self._lock:
            if len(self._records) + len(records) > self.capacity:
                return False
            self._records.extend(records)
            return True

    def take(self) -> list[Event]:
        """Return every buffered record, oldest first, and empty the buffer."""
        with self._lock:
            records = self._records
            self._records = []
            return records

    def __len__(self) -> int:
        return len(self._records)
