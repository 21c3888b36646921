"""The block-reference stream the miss-ratio curve reads: per request, its cacheable blocks.

A request, as vLLM's KV cache sees it one request at a time: the content key of each full
block it caches (prompt blocks, then blocks that decoded output tokens completed), in block
order, and how many blocks it holds at its peak (a partial last block included: it takes a
block while the request runs but is never cached).

Two sources:
- a trace (`trace_block_stream`): keys are chained hashes of each block's tokens, with the
  request's namespace (LoRA adapter, cache salt) at the root, as vLLM chains its own;
- a run file (`run_block_stream`): keys are the block hashes vLLM itself recorded in the
  run's hit and store events.

Equal keys mean equal blocks; the key values mean nothing else, but they are the same in
every process (SHARDS sampling picks blocks by key).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from collector.model.trace_request import MOONCAKE_BLOCK_TOKENS, TraceRequest

Namespace = Callable[[TraceRequest], Hashable]
_OUTPUT = -1  # marks the content of a block of unique output tokens


@dataclass(frozen=True, slots=True)
class RequestBlocks:
    """One request's cacheable block keys (block order) and the blocks it holds at its peak."""

    keys: tuple[Hashable, ...]
    num_prompt_tokens: int
    num_blocks: int


def num_kv_tokens(num_prompt_tokens: int, output_length: int) -> int:
    """Tokens whose KV a finished request holds: the prompt and every output token but the
    last (the last sampled token is never fed back)."""
    return num_prompt_tokens + max(output_length - 1, 0)


def vllm_namespace(request: TraceRequest) -> Hashable:
    """What vLLM mixes into a request's block hashes besides tokens: LoRA adapter, salt."""
    return (request.lora, request.cache_salt)


def trace_block_stream(
    requests: Sequence[TraceRequest], block_size: int, namespace: Namespace = vllm_namespace
) -> list[RequestBlocks]:
    """The stream of a trace at `block_size`, requests in trace order.

    Output tokens the trace does not give are unique to their request (as in kvscope's
    replay), so a block they complete is never reused.
    """
    stream = []
    for index, request in enumerate(requests):
        num_tokens = num_kv_tokens(request.num_prompt_tokens, request.output_length)
        num_full = num_tokens // block_size
        num_prompt_full = request.num_prompt_tokens // block_size
        contents: list[Hashable] = _prompt_block_contents(request, block_size, num_prompt_full)
        contents += _output_block_contents(request, index, block_size, num_prompt_full, num_full)
        parent: Hashable = _stable_hash(namespace(request))
        keys = []
        for content in contents:
            parent = hash((parent, content))
            keys.append(parent)
        stream.append(
            RequestBlocks(tuple(keys), request.num_prompt_tokens, -(-num_tokens // block_size))
        )
    return stream


def _stable_hash(value: Hashable) -> int:
    """The same number for the same value in every process (str hashes are salted)."""
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "big")


def _prompt_block_contents(request: TraceRequest, block_size: int, num_full: int) -> list[Hashable]:
    """What identifies each full prompt block's tokens, without expanding Mooncake ids."""
    if request.token_ids is not None:
        tokens = request.token_ids
        return [
            tokens[start : start + block_size]
            for start in range(0, num_full * block_size, block_size)
        ]
    assert request.hash_ids is not None
    hash_ids = request.hash_ids
    unit = MOONCAKE_BLOCK_TOKENS
    if unit % block_size == 0:
        # Token `offset` of Mooncake block `h` is h * 512 + offset: (h, offset) names a token run.
        return [
            (hash_ids[start // unit], start % unit)
            for start in range(0, num_full * block_size, block_size)
        ]
    contents: list[Hashable] = []
    for start in range(0, num_full * block_size, block_size):
        end = start + block_size
        pieces = []
        for unit_index in range(start // unit, (end - 1) // unit + 1):
            low = max(start, unit_index * unit) - unit_index * unit
            high = min(end, (unit_index + 1) * unit) - unit_index * unit
            pieces.append((hash_ids[unit_index], low, high))
        contents.append(tuple(pieces))
    return contents


def _output_block_contents(
    request: TraceRequest, index: int, block_size: int, first: int, end: int
) -> list[Hashable]:
    """Blocks `first..end-1`, which hold output tokens (and maybe the prompt's tail)."""
    if first >= end:
        return []
    if request.output_token_ids is None:
        return [(_OUTPUT, index, position) for position in range(first, end)]
    prompt = (
        request.token_ids if request.token_ids is not None else tuple(request.prompt_token_ids())
    )
    tokens = prompt + request.output_token_ids
    return [
        tokens[position * block_size : (position + 1) * block_size]
        for position in range(first, end)
    ]
