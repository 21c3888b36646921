"""One request of a trace, as every layer reads it: the replay drives vLLM with it, the
miss-ratio curve and the run's request queries rebuild its blocks from it.

Mooncake traces name a prompt by block ids (`hash_ids`): one id per 512-token block, expanded
into a deterministic run of 512 token ids (`id * 512 + offset`). Output tokens a trace does
not record are stand-ins no prompt holds (`output_token`).
"""

from __future__ import annotations

from dataclasses import dataclass

MOONCAKE_BLOCK_TOKENS = 512
OUTPUT_TOKEN_BASE = 1_000_000_000


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace, validated; prompt tokens are expanded on demand."""

    line: int
    request_id: str
    timestamp_ms: float
    num_prompt_tokens: int
    output_length: int
    tenant: str | None = None
    lora: str | None = None
    cache_salt: str | None = None
    token_ids: tuple[int, ...] | None = None
    hash_ids: tuple[int, ...] | None = None
    output_token_ids: tuple[int, ...] | None = None

    def prompt_token_ids(self) -> list[int]:
        """The prompt as token ids (Mooncake ids expanded, cut at the input length)."""
        if self.token_ids is not None:
            return list(self.token_ids)
        assert self.hash_ids is not None
        tokens: list[int] = []
        for block_id in self.hash_ids:
            start = block_id * MOONCAKE_BLOCK_TOKENS
            tokens.extend(range(start, start + MOONCAKE_BLOCK_TOKENS))
        del tokens[self.num_prompt_tokens :]
        return tokens


def output_token(trace_request: TraceRequest, index: int, position: int) -> int:
    """The output token at `position` of the trace's request number `index`: the trace's own
    where it has one, else one no prompt holds (unique to the request and the position)."""
    recorded = trace_request.output_token_ids
    if recorded is not None and position < len(recorded):
        return int(recorded[position])
    return OUTPUT_TOKEN_BASE + (index << 12) + position
