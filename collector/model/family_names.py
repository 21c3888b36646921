"""A prefix family's name wherever one is shown (the app's pages, `kvscope explain`): its
first block's hash (8 hex digits) and the tenant that first stored that block."""

from __future__ import annotations

from typing import Any

import pandas as pd


def family_name(root: Any, owner: Any, missing: str = "(unknown)") -> str:
    """`root` is the first block's hash (an integer; missing gives `missing`); `owner` its
    first storer's tenant, as shown (a nickname for a pseudonym)."""
    if pd.isna(root):
        return missing
    return f"{int(root):016x}"[:8] + f" ({owner if isinstance(owner, str) else 'no tenant'})"
