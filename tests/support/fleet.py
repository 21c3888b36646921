"""A hand-built trace of two prefix families for fleet replays: its answers are known by
hand (tests/test_fleet_replay.py, tests/test_advisor_routing.py)."""

from __future__ import annotations

from typing import Any

BLOCK_SIZE = 4
FAMILIES = {"A": list(range(1, 9)), "B": list(range(101, 109))}  # two blocks of prefix each
ORDER = "AABBAABB"


def family_trace() -> list[dict[str, Any]]:
    """Requests of two prefix families, A A B B A A B B: each prompt is its family's two
    blocks then one block of its own (12 tokens), so a hit is the family's 8 tokens (vLLM
    computes the last prompt token again: at most 11 // 4 = 2 blocks hit)."""
    return [
        {
            "request_id": f"{family}{number}",
            "timestamp": number * 100,
            "token_ids": FAMILIES[family] + [1_000 + 10 * number + k for k in range(4)],
            "output_length": 1,
        }
        for number, family in enumerate(ORDER)
    ]
