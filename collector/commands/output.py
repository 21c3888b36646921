"""How commands print figures: aligned text for people, one JSON line for scripts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def print_summary(summary: Mapping[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, sort_keys=True))
        return
    width = max(len(name) for name in summary)
    for name, value in summary.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        print(f"{name:<{width}}  {shown}")
