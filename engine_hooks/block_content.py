"""What the hooks read of a request's blocks: hashes at the pool's block size, the kinds of
extra keys vLLM mixes into them, and (opt-in) their token ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def block_hashes_at(request_hashes: Any, hash_block_size: int, block_size: int) -> Any:
    """The request's chained hashes at the pool's block size (vLLM's own resolution)."""
    if hash_block_size == block_size:
        return request_hashes
    from vllm.v1.core.kv_cache_utils import resolve_block_hashes

    return resolve_block_hashes(request_hashes, hash_block_size, block_size)


def extra_key_kinds(request: Any, positions: Sequence[int]) -> list[tuple[str, ...] | None] | None:
    """Per block, the kinds of extra hash keys vLLM mixes in (names only, never values)."""
    kinds: tuple[str, ...] = ()
    if request.lora_request:
        kinds += ("lora",)
    if request.mm_features:
        kinds += ("mm",)
    if request.prompt_embeds is not None:
        kinds += ("prompt_embeds",)
    salted = bool(request.cache_salt) and positions[0] == 0
    if not kinds and not salted:
        return None
    per_block: list[tuple[str, ...] | None] = [kinds or None] * len(positions)
    if salted:
        per_block[0] = (*kinds, "cache_salt")  # vLLM salts the first block only
    return per_block


def block_token_ids(request: Any, positions: Sequence[int], block_size: int) -> list[list[int]]:
    """The token ids of the request's blocks at `positions`."""
    token_ids = request.all_token_ids
    return [
        list(token_ids[position * block_size : (position + 1) * block_size])
        for position in positions
    ]
