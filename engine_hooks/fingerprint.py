"""Independent fingerprints of block contents, two chains from one pass over the tokens: the
collision check's, and the key-free one that tells a key mismatch (docs/miss-causes.md).

A block's **collision fingerprint** is XXH3-128 over its parent's fingerprint, its token ids
(as int32: `vllm_api.token_span`) and, where vLLM mixes extra keys into its own hash (LoRA,
multimodal inputs, cache salt, prompt embeddings: vLLM's own
`generate_block_hash_extra_keys`), their `repr`. Two blocks with the same fingerprint hold
the same prefix under the same keys; a prefix hit whose cached block carries another
fingerprint than the request's own is a collision: another prompt's KV served for this one.
Its **key-free fingerprint** is the same chain without the extra keys: the same tokens under
another salt or adapter get the same one. A request without any extra key (no LoRA, no
multimodal input, no prompt embeddings, no salt) has one chain for both, computed once, and
vLLM's helper is never called for it.

Why XXH3 checks vLLM's hash although vLLM may hash with xxHash itself: what the check must
catch is two prefixes sharing vLLM's key, and a pair that collides in vLLM's hash would have
to collide here too. It does not share vLLM's input: vLLM hashes a pickled or CBOR-encoded
tuple (parent hash, token tuple, extra keys) from its own seed (`NONE_HASH`, random per
process unless PYTHONHASHSEED is set); this chain hashes the raw token bytes after a 16-byte
parent, from a secret root and 64-bit seed (below): another function, another
serialisation, another key, so vLLM's collisions, crafted or not, are not ones of this
chain. 128 bits make an accidental collision of two fingerprints take about 2^64 blocks.
(BLAKE2b did the same at seven times XXH3's cost per block, half again the block manager's
time: docs/benchmarks.md.)

Keyed, for privacy: a fingerprint of token ids is a hash of prompt content, and the blocks of
a guessed prompt could be tested against it. The chain's root and seed are a 24-byte key
derived from the deployment's kvscope secret (`Pseudonymizer.key`: the secret that keys the
tenant and salt pseudonyms), never sent or stored: whoever holds a run file and not the
secret cannot compute the fingerprint of a guessed prompt, and a replay with the same secret
gives the same fingerprints (a key mismatch is only told between blocks of one engine, so
they need to agree within one engine run; they agree further). Only the key-free chain's
low 64 bits leave the engine (with each `Store`); the collision chain stays in it, but for
the two fingerprints of a `Collision` record. XXH3 under a secret key is not a proven MAC:
short of a cryptanalysis of XXH3 that recovers a 192-bit key from truncated outputs, the
key holds; a deployment that must rule that out too switches the fingerprints off
(KVSCOPE_CHECK_COLLISIONS=0). A keyed BLAKE2b per stored block would cost as much as the
whole check does now (docs/benchmarks.md).

Kept per running request (its chains) and per block (the fingerprint it was last stored
with, and by whom), in dicts keyed by block id, so a whole list of blocks is read or updated
in C (map, zip, update). A block that left the cache keeps its entry until it is stored
again: vLLM hits only cached blocks, and every block it caches goes through a hooked store
since it was last handed out, so a hit always reads the latest store's fingerprint, and the
hooks pay nothing per block allocated or evicted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import repeat
from typing import TYPE_CHECKING

from xxhash import xxh3_128_digest

from engine_hooks.vllm_api import token_span

if TYPE_CHECKING:
    from vllm.v1.request import Request

FINGERPRINT_BYTES = 16
KEY_BYTES = FINGERPRINT_BYTES + 8  # the root, then the seed


def has_extra_keys(request: Request) -> bool:
    """Whether vLLM mixes any extra key into the request's block hashes (block_content.py's
    kinds, all at once)."""
    return bool(
        request.lora_request
        or request.mm_features
        or request.prompt_embeds is not None
        or request.cache_salt
    )


class BlockFingerprints:
    """Per running request, its two fingerprint chains (collision, key-free), computed as far
    as needed; per cached block, the collision fingerprint it was stored with."""

    def __init__(self, block_size: int, key: bytes) -> None:
        self.block_size = block_size
        self._root = key[:FINGERPRINT_BYTES]
        self._seed = int.from_bytes(key[FINGERPRINT_BYTES:KEY_BYTES], "little")
        # Per request: (collision chain, key-free chain), one list twice without extra keys.
        self._chains: dict[str, tuple[list[bytes], list[bytes]]] = {}
        self._stored: dict[int, bytes] = {}
        self._stored_by: dict[int, str] = {}

    def chains(self, request: Request, num_blocks: int) -> tuple[list[bytes], list[bytes]]:
        """The collision and key-free fingerprints of the request's first `num_blocks`
        blocks (or more: cached per request)."""
        chains = self._chains.get(request.request_id)
        if chains is None:
            own: list[bytes] = []
            chains = (own, [] if has_extra_keys(request) else own)
            self._chains[request.request_id] = chains
        collision, key_free = chains
        if len(collision) < num_blocks:
            if collision is key_free:
                self._extend(request, collision, num_blocks)
            else:
                self._extend_keyed(request, collision, key_free, num_blocks)
        return chains

    def _token_bytes(self, request: Request, first: int, end: int) -> tuple[bytes, int]:
        """The token ids of blocks `first`..`end` - 1, packed once for the whole span, and the
        bytes of one block in it."""
        size = self.block_size
        tokens = token_span(request, first * size, end * size)
        return tokens.tobytes(), size * tokens.itemsize

    def _extend(self, request: Request, chain: list[bytes], num_blocks: int) -> None:
        """One chain for both: no extra key anywhere in the request."""
        data, width = self._token_bytes(request, len(chain), num_blocks)
        parent = chain[-1] if chain else self._root
        seed, append = self._seed, chain.append
        for offset in range(0, len(data) - width + 1, width):
            parent = xxh3_128_digest(parent + data[offset : offset + width], seed)
            append(parent)

    def _extend_keyed(
        self, request: Request, collision: list[bytes], key_free: list[bytes], num_blocks: int
    ) -> None:
        """Both chains in one pass, the collision one with vLLM's extra keys of each block."""
        from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        size, seed, first = self.block_size, self._seed, len(collision)
        data, width = self._token_bytes(request, first, num_blocks)
        keyed = collision[-1] if collision else self._root
        free = key_free[-1] if key_free else self._root
        for position, offset in zip(
            range(first, num_blocks), range(0, len(data) - width + 1, width), strict=False
        ):
            tokens = data[offset : offset + width]
            # Index 0: vLLM's helper skips multimodal inputs that end before the block.
            extra_keys, _ = generate_block_hash_extra_keys(
                request, position * size, (position + 1) * size, 0
            )
            free = xxh3_128_digest(free + tokens, seed)
            if extra_keys is not None:
                tokens += repr(extra_keys).encode()
            keyed = xxh3_128_digest(keyed + tokens, seed)
            key_free.append(free)
            collision.append(keyed)

    def mismatches(
        self, request: Request, block_ids: list[int], first_position: int = 0
    ) -> Iterator[tuple[int, bytes, str | None, bytes]]:
        """For each hit block (at positions `first_position`.. of the request) whose stored
        fingerprint is not the request's own: its index in `block_ids`, the stored
        fingerprint, who stored it, and the request's own."""
        end = first_position + len(block_ids)
        expected = self.chains(request, end)[0][first_position:end]
        stored = list(map(self._stored.get, block_ids))
        if stored == expected:  # every hit as stored: compared in C
            return
        for index, (theirs, own) in enumerate(zip(stored, expected, strict=False)):
            if theirs is not None and theirs != own:
                yield index, theirs, self._stored_by.get(block_ids[index]), own

    def forget(self, request_id: str) -> None:
        """Drop a request's chains (it finished or was preempted)."""
        self._chains.pop(request_id, None)

    def store(self, block_ids: list[int], fingerprints: Iterable[bytes], stored_by: str) -> None:
        """Blocks just cached, with their collision fingerprints and the request that stored
        them."""
        self._stored.update(zip(block_ids, fingerprints, strict=True))
        self._stored_by.update(zip(block_ids, repeat(stored_by), strict=False))

    def clear(self) -> None:
        """vLLM reset its prefix cache."""
        self._stored.clear()
        self._stored_by.clear()
