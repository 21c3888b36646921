"""Block streams of handcrafted prompts (block size 4), for the policy and tier tests."""

from __future__ import annotations

from collections.abc import Sequence

from collector.model.block_stream import RequestBlocks, trace_block_stream
from collector.replay.traces import TraceRequest

BLOCK_SIZE = 4


def stream_of(prompts: Sequence[Sequence[int]], output_length: int = 1) -> list[RequestBlocks]:
    """The block stream of these prompts, one request each, in order."""
    requests = [
        TraceRequest(
            line=index + 1,
            request_id=f"r{index}",
            timestamp_ms=float(index),
            num_prompt_tokens=len(prompt),
            output_length=output_length,
            token_ids=tuple(prompt),
        )
        for index, prompt in enumerate(prompts)
    ]
    return trace_block_stream(requests, BLOCK_SIZE)
