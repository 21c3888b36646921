"""Comma-separated lists of positive numbers, as options take them (`--kv-gib 2,4,8`)."""

from __future__ import annotations

import argparse
from typing import Any


def number_list(kind: type, text: str) -> list[Any]:
    """`text` as a list of positive `kind`s; argparse's error otherwise."""
    try:
        values = [kind(item) for item in text.split(",") if item.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from error
    if not values or any(value <= 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values
