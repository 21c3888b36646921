"""Token ids back to text, with a tokenizer already on this machine (never downloaded):
a `tokenizer.json` file, a folder holding one, or a model name in the Hugging Face cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOKENIZER_FILE = "tokenizer.json"


def load_local_tokenizer(name_or_path: str) -> Any | None:
    """The tokenizer named, if it is on this machine; None if it is not (or cannot be read)."""
    from tokenizers import Tokenizer

    name_or_path = name_or_path.strip()
    if not name_or_path:
        return None
    candidate = Path(name_or_path).expanduser()
    if candidate.is_dir():
        candidate = candidate / TOKENIZER_FILE
    if not candidate.is_file():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name_or_path, TOKENIZER_FILE)
        if not isinstance(cached, str):
            return None
        candidate = Path(cached)
    try:
        return Tokenizer.from_file(str(candidate))
    except Exception:  # a broken or foreign file is "no tokenizer", not a crash
        return None


def decode(tokenizer: Any, token_ids: list[int]) -> str:
    """The text of token ids, special tokens kept (they are part of what was cached)."""
    return str(tokenizer.decode(token_ids, skip_special_tokens=False))
