"""kvscope's copy of vLLM's KV event wire format decodes what vLLM's own classes encode."""

from __future__ import annotations

import msgspec
import pytest

from collector.vllm_kv import wire as vllm_kv_wire
from engine_hooks.versions import SUPPORTED_VLLM
from tests.support.modules import loaded_modules

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def vllm_batch() -> object:
    """A KVEventBatch from vLLM's own classes with every field set."""
    from vllm.distributed.kv_events import (  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        KVEventBatch,
    )

    newer = {"lookahead_token_ids": [[9], [10]]}  # vLLM 0.33's; 0.32 has no such field
    stored = BlockStored(
        block_hashes=[2**64 - 1, b"\x01" * 32],
        parent_block_hash=12345,
        token_ids=[1, 2, 3, 4, 5, 6, 7, 8],
        block_size=4,
        lora_id=7,
        medium="GPU",
        lora_name="adapter",
        extra_keys=[("adapter", ("image-1", 0), "salt"), None],
        group_idx=1,
        kv_cache_spec_kind="full_attention",
        kv_cache_spec_sliding_window=128,
        locality="LOCAL",
        ownership="tier-2",
        session_id="session",
        **{name: value for name, value in newer.items() if name in BlockStored.__struct_fields__},
    )
    removed = BlockRemoved(
        block_hashes=[5], medium="CPU", group_idx=1, locality="REMOTE", ownership="tier-2"
    )
    return KVEventBatch(ts=1.25, events=[stored, removed, AllBlocksCleared()], data_parallel_rank=3)


@pytest.mark.parametrize("name", ["BlockStored", "BlockRemoved", "AllBlocksCleared"])
def test_the_event_structs_have_exactly_vllms_fields(name: str) -> None:
    """vLLM's fields, in vLLM's order; an older vLLM of the window lacks only the newest."""
    import vllm  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    import vllm.distributed.kv_events as vllm_events  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    theirs = getattr(vllm_events, name).__struct_fields__
    ours = getattr(vllm_kv_wire, name).__struct_fields__
    if vllm.__version__.startswith(SUPPORTED_VLLM[-1]):
        assert ours == theirs
    else:
        assert ours[: len(theirs)] == theirs


def test_a_batch_encoded_by_vllm_decodes_field_for_field() -> None:
    batch = vllm_batch()
    decoded = vllm_kv_wire.decode_batch(msgspec.msgpack.encode(batch))
    assert decoded.ts == 1.25
    assert decoded.data_parallel_rank == 3
    stored, removed, cleared = decoded.events
    assert isinstance(stored, vllm_kv_wire.BlockStored)
    assert isinstance(removed, vllm_kv_wire.BlockRemoved)
    assert isinstance(cleared, vllm_kv_wire.AllBlocksCleared)
    # No field lost or altered: every field vLLM encoded decodes to the same value (each
    # block's extra keys stay encoded, as vLLM encoded them).
    assert stored.extra_keys is not None
    keys = [msgspec.msgpack.decode(raw) for raw in stored.extra_keys]
    assert keys == [["adapter", ["image-1", 0], "salt"], None]
    assert vllm_kv_wire.block_extra_keys(stored, 1) is None
    stored.extra_keys = keys
    ours, theirs = (msgspec.json.decode(msgspec.json.encode(one)) for one in (decoded, batch))
    assert ours[0] == theirs[0] and ours[2] == theirs[2]  # the timestamp, the DP rank
    for event, vllm_event in zip(ours[1], theirs[1], strict=True):
        assert {name: event.get(name) for name in vllm_event} == vllm_event
    assert stored.block_hashes == [2**64 - 1, b"\x01" * 32]


def test_older_batches_without_newer_fields_still_decode() -> None:
    """What vLLM 0.8 sent: no medium, lora_name, group_idx, and no DP rank."""
    payload = msgspec.msgpack.encode(
        [
            9.5,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [-3],
                    "parent_block_hash": None,
                    "token_ids": [1, 2],
                    "block_size": 2,
                    "lora_id": None,
                },
                {"type": "BlockRemoved", "block_hashes": [-3]},
            ],
        ]
    )
    decoded = vllm_kv_wire.decode_batch(payload)
    stored, removed = decoded.events
    assert isinstance(stored, vllm_kv_wire.BlockStored)
    assert isinstance(removed, vllm_kv_wire.BlockRemoved)
    assert (stored.medium, stored.group_idx, decoded.data_parallel_rank) == (None, None, None)
    assert vllm_kv_wire.hash64(stored.block_hashes[0]) == 2**64 - 3  # Python hash(): signed


def test_hash64_is_vllms_own_conversion() -> None:
    from vllm.v1.core.kv_cache_utils import BlockHash, maybe_convert_block_hash  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    full = bytes(range(32))
    assert vllm_kv_wire.hash64(full) == maybe_convert_block_hash(BlockHash(full))
    assert vllm_kv_wire.hash64(maybe_convert_block_hash(BlockHash(full))) == int.from_bytes(
        full[-8:], "big"
    )


def test_the_subscriber_loads_neither_vllm_nor_torch() -> None:
    """The collector starts in a blink: decoding vLLM's events does not import vLLM."""
    modules = loaded_modules(
        "import collector.live.vllm_kv_subscriber, collector.vllm_kv.ingest, "
        "collector.vllm_kv.conflicts, collector.queries.vllm_kv"
    )
    assert not modules & {"vllm", "torch", "streamlit", "plotly"}
