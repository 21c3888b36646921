"""Token ids to text and back, with a tokenizer already on this machine (never downloaded).

A tokenizer is named by one of:
- a `tokenizer.json` file (Hugging Face `tokenizers`), or a folder holding one;
- a SentencePiece model file (`tokenizer.model`, Mistral's `tokenizer.model.v1`), or a
  folder holding a `tokenizer.model`;
- a file inside an installed Python package, written `package:path`: the sample's is
  `mistral_common:data/tokenizer.model.v1`, Mistral 7B's tokenizer, which the
  `mistral_common` package (a vLLM requirement) ships;
- a model name whose tokenizer is in the Hugging Face cache (`mistralai/Mistral-7B-v0.1`).
"""

from __future__ import annotations

import importlib.resources
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JSON_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "tokenizer.model"
# Mistral 7B v0.1's tokenizer (32,000 tokens), as vLLM's requirement mistral_common ships it.
SAMPLE_TOKENIZER = "mistral_common:data/tokenizer.model.v1"
PACKAGE_FILE = re.compile(r"(?P<package>[A-Za-z_][\w.]+):(?P<path>[\w.-][\w./-]*)")


@dataclass(frozen=True)
class TextTokenizer:
    """A loaded tokenizer: `tokenizers.Tokenizer` or `sentencepiece.SentencePieceProcessor`."""

    name: str
    backend: Any

    def encode(self, text: str) -> list[int]:
        """The token ids of text, with no special tokens added."""
        if hasattr(self.backend, "encode_as_ids"):
            return list(self.backend.encode_as_ids(text))
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: list[int]) -> str:
        """The text of token ids, special tokens kept (they are part of what was cached)."""
        if hasattr(self.backend, "decode_ids"):
            return str(self.backend.decode_ids(token_ids))
        return str(self.backend.decode(token_ids, skip_special_tokens=False))


def load_local_tokenizer(name_or_path: str) -> TextTokenizer | None:
    """The tokenizer named, if it is on this machine; None if it is not (or cannot be read)."""
    name_or_path = name_or_path.strip()
    file = _local_file(name_or_path) if name_or_path else None
    if file is None:
        return None
    try:
        if file.suffix == ".json":
            from tokenizers import Tokenizer  # noqa: PLC0415 - tokenizers is optional: only token text needs it

            return TextTokenizer(name_or_path, Tokenizer.from_file(str(file)))
        from sentencepiece import SentencePieceProcessor  # noqa: PLC0415 - sentencepiece is optional: only token text needs it

        return TextTokenizer(name_or_path, SentencePieceProcessor(model_file=str(file)))
    except Exception:  # a broken or foreign file, or no library to read it: "no tokenizer"
        return None


def _local_file(name: str) -> Path | None:
    package_file = PACKAGE_FILE.fullmatch(name)
    if package_file:
        return _package_file(package_file["package"], package_file["path"])
    candidate = Path(name).expanduser()
    if candidate.is_dir():
        return next(
            (
                candidate / file
                for file in (JSON_FILE, SENTENCEPIECE_FILE)
                if (candidate / file).is_file()
            ),
            None,
        )
    if candidate.is_file():
        return candidate
    return _cached_file(name)


def _package_file(package: str, path: str) -> Path | None:
    try:
        file = Path(str(importlib.resources.files(package).joinpath(path)))
    except (ImportError, TypeError, ValueError):
        return None
    return file if file.is_file() else None


def _cached_file(model: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415 - huggingface_hub is optional: only token text needs it
    except ImportError:
        return None
    for file in (JSON_FILE, SENTENCEPIECE_FILE):
        try:
            cached = try_to_load_from_cache(model, file)
        except Exception:  # not a repository name: "no tokenizer"
            return None
        if isinstance(cached, str):
            return Path(cached)
    return None
