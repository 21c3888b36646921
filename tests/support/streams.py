"""Block streams of handcrafted prompts (block size 4), for the policy and tier tests."""

from __future__ import annotations

from collections.abc import Sequence

from collector.model.block_stream import RequestBlocks, trace_block_stream
from collector.model.trace_request import TraceRequest

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


def hot_and_scan() -> list[RequestBlocks]:
    """A hot prompt H (13 tokens: 3 full blocks, all hit-eligible, and a partial one) every
    third request, two unique 13-token scan prompts between its visits: H, S0, S1, H, S2, S3,
    H, S4, S5, H, S6, S7, H. LRU keeps H only with room for it and both scans (11 usable
    blocks); pinning H or not caching the scans keeps it from 7 (8 blocks)."""
    hot = list(range(1, 14))
    prompts: list[list[int]] = []
    for visit in range(4):
        scans = [[100 * (2 * visit + one) + token for token in range(1, 14)] for one in (1, 2)]
        prompts += [hot, *scans]
    return stream_of([*prompts, hot])
