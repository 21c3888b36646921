"""What the hooks read of a request's blocks: the kinds of extra keys vLLM mixes into their
hashes, and (opt-in) their token ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
