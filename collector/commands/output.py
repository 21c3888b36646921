"""How commands print figures: aligned text for people, one JSON line for scripts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from collector.safe_text import shown


def print_summary(summary: Mapping[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, sort_keys=True))
        return
    width = max(len(name) for name in summary)
    for name, value in summary.items():  # hash_algo is the engine's word: shown escaped
        text = f"{value:.4f}" if isinstance(value, float) else shown(value)
        print(f"{name:<{width}}  {text}")
