"""Why a message from an engine is refused: the engines' socket and vLLM's KV events alike."""

from __future__ import annotations


class RejectedMessage(ValueError):
    """A message that is not a well-formed batch; `reason` is its class, for counting."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
