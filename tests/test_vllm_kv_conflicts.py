"""Two different blocks under one published 64-bit hash: found when they happen, never when
they do not (vLLM's real sha256 on the sample workload)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.queries.summary import run_summary
from collector.queries.vllm_kv import vllm_kv_summary
from collector.replay.block_manager import CacheSettings
from collector.store.run_file import RunFile
from collector.vllm_kv.conflicts import HashConflictDetector
from collector.vllm_kv.ingest import append_vllm_batches
from collector.vllm_kv.wire import AllBlocksCleared, BlockRemoved, BlockStored, ReceivedBatch
from tests.support.block_manager import cached_block_count
from tests.support.repo import SAMPLE_RUN
from tests.support.vllm_kv_pipeline import (
    H,
    checked_sockets,
    encoded,
    events_run,
    low64,
    receive,
    received,
    replay_sample,
    stored,
    subscriber_for,
    wait_until_sent,
    zmq_publisher,
)

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


@pytest.fixture
def sockets() -> Iterator[Path]:
    with checked_sockets() as directory:
        yield directory


def removed(block_hash: int, medium: str = "GPU") -> BlockRemoved:
    return BlockRemoved(block_hashes=[block_hash], medium=medium, group_idx=0)


def conflicts_of(*batches: ReceivedBatch) -> list[tuple[int, int, tuple[str, ...]]]:
    """(first seq, second seq, what differs) of each conflict the detector reports."""
    found = HashConflictDetector().observe(list(batches))
    return [(conflict.first.seq, conflict.second.seq, conflict.differs) for conflict in found]


def test_other_tokens_or_another_parent_under_one_hash_is_a_conflict() -> None:
    assert conflicts_of(
        received(0, stored(H, [1, 2, 3, 4])),
        received(1, stored(H, [1, 2, 3, 4])),  # the same block again: fine
        received(2, stored(H, [5, 6, 7, 8])),
        received(3, stored(H, [1, 2, 3, 4], parent=99)),
        received(4, stored(H, [5, 6, 7, 8])),  # that one is already reported
        received(5, stored(H, [1, 2, 3, 4], extra_keys=[["tenant-salt"]])),
    ) == [(0, 2, ("tokens",)), (0, 3, ("parent",)), (0, 5, ("keys",))]


def test_a_removed_or_cleared_hash_is_forgotten() -> None:
    assert (
        conflicts_of(
            received(0, stored(H, [1, 2, 3, 4])),
            received(1, removed(H)),
            received(2, stored(H, [5, 6, 7, 8])),
            received(3, AllBlocksCleared()),
            received(4, stored(H, [9, 9, 9, 9])),
        )
        == []
    )


def test_a_hash_stays_known_while_any_holder_still_caches_it() -> None:
    assert conflicts_of(
        received(0, stored(H, [1, 2, 3, 4])),
        received(1, stored(H, [1, 2, 3, 4]), dp_rank=1),
        received(2, stored(H, [1, 2, 3, 4], medium="CPU")),
        received(3, removed(H)),  # rank 0 GPU drops it; rank 0 CPU and rank 1 keep it
        received(4, AllBlocksCleared()),  # rank 0 clears; rank 1 keeps it
        received(5, stored(H, [5, 6, 7, 8])),
    ) == [(0, 5, ("tokens",))]


def test_no_conflict_across_groups_or_between_full_hashes() -> None:
    full = H.to_bytes(8, "big")
    assert (
        conflicts_of(
            received(0, stored(H, [1, 2, 3, 4], group_idx=0)),
            received(1, stored(H, [5, 6, 7, 8], group_idx=1)),  # another KV cache group
            received(2, stored(b"\x01" * 24 + full, [1, 2, 3, 4])),
            received(3, stored(b"\x02" * 24 + full, [5, 6, 7, 8])),  # same low 64 bits only
        )
        == []
    )


def table_rows(run_file: RunFile, table: str) -> list[tuple[Any, ...]]:
    return run_file.rows(
        f"SELECT * EXCLUDE (first_tokens_digest, second_tokens_digest) FROM {table}"
    )


def described(seq: int, parent: int | None, tokens: list[int]) -> tuple[Any, ...]:
    """One side of a conflict row of the crafted test below: DP rank, epoch, batch number,
    its time (ns; batch `seq` was sent at 100 + seq s), parent, tokens in the block, LoRA
    and the token ids."""
    return (0, 0, seq, (100 + seq) * 1_000_000_000, parent, 4, None, tokens)


def test_crafted_blocks_sharing_a_64_bit_hash_reach_the_run_file(
    sockets: Path, tmp_path: Path
) -> None:
    """Two BlockStored events vLLM's own publisher sends with one int hash and other tokens,
    then one with another parent; each conflict row describes both blocks."""
    from vllm.distributed.kv_events import BlockStored as VllmBlockStored  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays
    from vllm.distributed.kv_events import KVEventBatch as VllmKVEventBatch  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    def block(tokens: list[int], parent: int | None) -> VllmBlockStored:
        return VllmBlockStored(
            block_hashes=[H],
            parent_block_hash=parent,
            token_ids=tokens,
            block_size=4,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            group_idx=0,
        )

    with zmq_publisher(sockets) as publisher, subscriber_for(sockets) as subscriber:
        for seq, event in enumerate(
            [block([1, 2, 3, 4], None), block([5, 6, 7, 8], None), block([1, 2, 3, 4], 77)]
        ):
            publisher.publish(VllmKVEventBatch(ts=100.0 + seq, events=[event]))
        wait_until_sent(publisher)
        batches = receive(subscriber, 3)
        run = events_run(tmp_path / "run.duckdb", CacheSettings(4, 5))
        append_vllm_batches(run, batches, [], HashConflictDetector(record_token_ids=True))
    first = described(0, None, [1, 2, 3, 4])
    assert table_rows(run, "vllm_kv_conflicts") == [
        (H, None, 0, ["tokens"], *first, *described(1, None, [5, 6, 7, 8])),
        (H, None, 0, ["parent"], *first, *described(2, 77, [1, 2, 3, 4])),
    ]
    digests = run.rows("SELECT first_tokens_digest = second_tokens_digest FROM vllm_kv_conflicts")
    assert digests == [(False,), (True,)]
    assert vllm_kv_summary(run)["conflicts"] == 2
    run.close()


def weak_sha256(bits: int) -> Callable[[Any], bytes]:
    """vLLM's sha256 with all but `bits` of its low 64 bits zeroed: the full hash (vLLM's
    own key) still tells blocks apart, the published 64-bit form often does not."""
    from vllm.utils.hashing import sha256  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

    def weak(value: Any) -> bytes:
        full = sha256(value)
        low = int.from_bytes(full[-8:], "big") & ((1 << bits) - 1)
        return full[:-8] + low.to_bytes(8, "big")

    return weak


def test_a_weak_hash_gives_exactly_the_conflicts_vllms_own_hashes_predict(
    sockets: Path, tmp_path: Path
) -> None:
    settings = CacheSettings(block_size=16, num_blocks=20_000)  # nothing is evicted
    run = events_run(tmp_path / "run.duckdb", settings)
    source, _ = replay_sample(sockets, run, settings, hash_fn=weak_sha256(12), limit=150)
    summary = vllm_kv_summary(run)
    assert summary["removed_blocks"] == 0 and summary["lost_batches"] == 0
    # Counted from vLLM's own cache: full hashes of every cached block, grouped by the
    # 64-bit form vLLM publishes; each distinct block beyond a group's first is one conflict.
    full_hashes = {
        bytes(block.block_hash[:-4])
        for block in source.manager.block_pool.blocks
        if block.block_hash is not None
    }
    assert len(full_hashes) == summary["stored_blocks"]
    per_published_hash = Counter(low64(full_hash) for full_hash in full_hashes)
    expected = sum(count - 1 for count in per_published_hash.values())
    assert expected > 100, "the weak hash must collide often"
    assert summary["conflicts"] == expected
    run.close()


def test_vllms_sha256_on_the_sample_workload_gives_no_conflict(
    sockets: Path, tmp_path: Path
) -> None:
    """The sample run's settings: vLLM's events agree with kvscope's own hooks on every
    store and eviction, and not one of those blocks conflicts."""
    settings = CacheSettings(block_size=16, num_blocks=1_200)
    run = events_run(tmp_path / "run.duckdb", settings)
    source, detector = replay_sample(sockets, run, settings)
    summary = vllm_kv_summary(run)
    with RunFile.open(SAMPLE_RUN) as sample:
        hooks = run_summary(sample)
    assert summary["stored_blocks"] == hooks["stores"] == detector.num_blocks_checked
    assert summary["removed_blocks"] == hooks["evictions"]
    assert summary["lost_batches"] == 0
    assert summary["conflicts"] == 0
    # What the detector still remembers is exactly what vLLM's cache holds at the end.
    assert detector.num_tracked == cached_block_count(source.manager)
    run.close()


def test_a_sliding_window_groups_events_are_stored_and_never_called_conflicts(
    tmp_path: Path,
) -> None:
    """A hybrid model's sliding-window group publishes the hashes of the blocks it stored with
    the tokens of the whole range it cached, or no hash at all: stored as they came, with no
    parent (the event does not say which), never compared."""
    window = BlockStored(
        block_hashes=[H, H + 1],
        parent_block_hash=7,
        token_ids=list(range(16)),  # four blocks of four tokens: the window kept two
        block_size=4,
        medium="GPU",
        group_idx=1,
        extra_keys=[encoded(None), encoded(None)],  # one entry per block, as decoded
    )
    empty = BlockStored(
        block_hashes=[], parent_block_hash=7, token_ids=list(range(8)), block_size=4, group_idx=1
    )
    same_hash_other_tokens = BlockStored(
        block_hashes=[H], parent_block_hash=None, token_ids=[9, 9, 9, 9], block_size=4, group_idx=1
    )
    detector = HashConflictDetector()
    run = events_run(tmp_path / "run.duckdb", CacheSettings(4, 5))
    batches = [received(0, window, empty), received(1, same_hash_other_tokens)]
    append_vllm_batches(run, batches, [], detector)
    rows = run.rows(
        "SELECT seq, block_hash, parent_hash, group_idx FROM vllm_kv_events ORDER BY seq, "
        "event_index, block_position"
    )
    assert rows == [(0, H, None, 1), (0, H + 1, None, 1), (1, H, None, 1)]
    assert detector.num_blocks_unchecked == 2 and detector.num_blocks_checked == 1
    assert vllm_kv_summary(run)["conflicts"] == 0
    run.close()


def test_the_blocks_remembered_are_bounded_whatever_a_publisher_stores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A publisher can claim any number of distinct blocks cached: the detector remembers at
    most `max_tracked` (a million by default, some 450 MB), counts the rest, says so once,
    and remembers new ones again once removals make room."""
    detector = HashConflictDetector(max_tracked=4)
    with caplog.at_level("WARNING", logger="kvscope.collect"):
        found = detector.observe(
            [received(seq, stored(H + seq, [seq, seq, seq, seq])) for seq in range(6)]
        )
    assert found == []
    assert (detector.num_tracked, detector.num_blocks_untracked) == (4, 2)
    assert [record.message for record in caplog.records] == [
        "kvscope collect: 4 cached blocks remembered, kvscope's limit: blocks stored beyond "
        "it are not checked for hash conflicts until some are removed"
    ]
    # A tracked block is still checked; a removal makes room for the next new one.
    conflicts = detector.observe(
        [
            received(6, stored(H, [9, 9, 9, 9])),
            received(7, removed(H + 1)),
            received(8, stored(H + 7, [7, 7, 7, 7])),
            received(9, stored(H + 7, [8, 8, 8, 8])),
        ]
    )
    assert [(conflict.first.seq, conflict.second.seq) for conflict in conflicts] == [(0, 6), (8, 9)]
    assert (detector.num_tracked, detector.num_blocks_untracked) == (4, 2)
