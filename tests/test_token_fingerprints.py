"""The key-free fingerprints (engine_hooks/fingerprint.py): the hooks send one per stored
block, equal for the same tokens after the same prefix under any extra key, and the
collector stores them per block row (events.token_fingerprint)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from collector.live.batch_check import check_batch
from collector.live.limits import Limits
from collector.model.rejected_message import RejectedMessage
from collector.store.ingest import to_batch
from collector.store.run_file import RunFile
from engine_hooks.events import WIRE_FORMAT, Store, pack_counts
from tests.support.block_manager import tiny_run
from tests.support.hostile import header

PROMPT = list(range(1, 13))  # three blocks of 4
FORKED = [1, 2, 3, 4, 99, 6, 7, 8, 9, 10, 11, 12]  # another second block, the same third


def stored_fingerprints(run_path: Path) -> dict[str, list[int | None]]:
    """Per request, the key-free fingerprint of each block it stored, by position."""
    with RunFile.open(run_path) as run:
        rows = run.rows(
            "SELECT request_id, block_position, token_fingerprint FROM events"
            " WHERE kind = 'store' ORDER BY request_id, block_position"
        )
    stored: dict[str, list[int | None]] = {}
    for request, position, fingerprint in rows:
        blocks = stored.setdefault(str(request), [None] * 3)
        blocks[int(position)] = fingerprint
    return stored


@pytest.mark.vllm
def test_the_same_tokens_share_a_fingerprint_under_any_key(tmp_path: Path) -> None:
    """A plain request (one chain, computed once), a salted one and one with an adapter (two
    chains in one pass) store the same key-free fingerprints; a prompt that differs from its
    second block on stores others from there on, though its third block's tokens are the
    same (the fingerprint chains the prefix)."""
    rows = [
        {"request_id": request, "timestamp": 10 * index, "token_ids": tokens, "output_length": 0}
        | extra
        for index, (request, tokens, extra) in enumerate(
            [
                ("plain", PROMPT, {}),
                ("salted", PROMPT, {"cache_salt": "x"}),
                ("adapter", PROMPT, {"lora": "alpha"}),
                ("forked", FORKED, {}),
            ]
        )
    ]
    run = tiny_run(tmp_path, rows, block_size=4, num_blocks=40, check_collisions=True)
    stored = stored_fingerprints(run)
    plain = stored["plain"]
    assert None not in plain and len(set(plain)) == 3
    assert stored["salted"] == stored["adapter"] == plain
    forked = stored["forked"]
    assert forked[0] is None  # a hit on the plain request's block: nothing stored
    assert forked[1] not in plain and forked[2] not in plain


def test_the_collector_stores_a_fingerprint_per_block_and_nulls_without() -> None:
    with_them = Store(
        0,
        1,
        "a",
        pack_counts([1, 2]),
        b"\x00" * 7 + b"\x01" + b"\x00" * 7 + b"\x02",
        None,
        0,
        16,
        token_fingerprints=b"\x00" * 7 + b"\x05" + b"\xff" * 8,
    )
    without = Store(1, 2, "b", pack_counts([3]), b"\x00" * 7 + b"\x03", None, 0, 16)
    events = to_batch([with_them, without]).events
    assert events is not None
    column = events.column("token_fingerprint").combine_chunks()
    assert column.type == pa.uint64()
    assert column.to_pylist() == [5, 2**64 - 1, None]


def test_a_collector_reads_hooks_from_before_the_fingerprints_and_checks_their_width() -> None:
    """Wire format 5 (no fingerprints) is read; a Store whose fingerprints are not 8 bytes a
    block is refused, as any block record whose columns disagree."""
    plain = Store(0, 1, "a", pack_counts([1, 2]), bytes(16), None, 0, 16)
    check_batch(header("e", [plain], wire_format=5), [plain], Limits())
    for width in (0, 7, 9):
        fingerprints = bytes(2 * width)  # two blocks
        record = Store(
            0, 1, "a", pack_counts([1, 2]), bytes(16), None, 0, 16, None, None, 0, fingerprints
        )
        with pytest.raises(RejectedMessage, match="token fingerprints not packed"):
            check_batch(header("e", [record]), [record], Limits())
    with pytest.raises(RejectedMessage, match="reads 5, 6 and 7"):
        check_batch(header("e", [plain], wire_format=4), [plain], Limits())
    assert WIRE_FORMAT == 7
