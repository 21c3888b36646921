"""What both halves of the hooks share (pool_hooks.py, hooks.py): the records' numbering and
their way into the engine's `EventBuffer`, removing every hook, and what the hooks do when
their own code fails: they stop, and vLLM runs on untouched."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from engine_hooks.buffer import EventBuffer
from engine_hooks.events import Event

Clock = Callable[[], int]

logger = logging.getLogger("vllm.kvscope")  # vLLM's own handlers print it
MAX_FAILURE_TEXT = 256  # a `Label` on the wire
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class Recorder:
    """Numbers the hooks' records and offers them to `buffer`, timed by `clock`; holds the
    hooks attached (target, method name) and stops them all at their first failure."""

    def __init__(self, buffer: EventBuffer, clock: Clock) -> None:
        self._buffer = buffer
        self._clock = clock
        self._seq = 0
        self.num_lost = 0
        self._attached: list[tuple[Any, str]] = []
        # A hook's own code failing stops capture (`failed`): never vLLM's call.
        self.failure: str | None = None
        self.num_failures = 0
        self.on_failure: Callable[[str], None] | None = None

    # -- attach / detach ---------------------------------------------------------------

    def detach(self) -> None:
        """Remove every hook; the manager and pool behave exactly as before attach."""
        for target, name in reversed(self._attached):
            delattr(target, name)
        self._attached.clear()

    @property
    def attached(self) -> bool:
        return bool(self._attached)

    def failed(self, error: Exception, hook: str) -> None:
        """A hook's own code raised (vLLM's call had run, or runs untouched): count it, and
        the first time log one line, stop recording, detach every hook of this engine and
        tell `on_failure` (the plugin records in the run that capture stopped, and why)."""
        self.num_failures += 1
        if self.failure is not None:
            return
        text = f"{hook}: {type(error).__name__}: {error}"
        self.failure = CONTROL_CHARACTERS.sub(" ", text)[:MAX_FAILURE_TEXT]
        logger.error(
            "kvscope: capture of this engine stopped, vLLM runs on untouched: %s", self.failure
        )
        try:
            self.detach()
            if self.on_failure is not None:
                self.on_failure(self.failure)
        except Exception as again:  # never into vLLM, even now
            logger.error("kvscope: stopping capture failed too: %r", again)

    # -- plumbing ----------------------------------------------------------------------

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq = seq + 1
        return seq

    @property
    def num_records(self) -> int:
        """Records numbered so far: the next record's `seq`."""
        return self._seq

    def _emit(self, records: list[Event]) -> None:
        # A refused batch leaves a gap in `seq`; whoever stores the stream records the gap
        # as a `Drop` (the hooks cannot: the buffer that would carry it is full). After a
        # failure nothing is recorded: a wrapper still on the stack records no more.
        if self.failure is not None:
            return
        if records and not self._buffer.offer(records):
            self.num_lost += len(records)
