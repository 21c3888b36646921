"""The temporary folder a rule replays a run into, and what a replay that cannot run means
for advice: the rule cannot judge the run (NotApplicable), saying why."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from collector.advisor.suggestion import NotApplicable
from collector.replay.block_manager import VllmUnavailable
from collector.store.run_file import StoreError


@contextmanager
def replay_folder(replay: str) -> Iterator[Path]:
    """A folder for the replays' run files, removed after; no supported vLLM, or settings
    vLLM refuses (a pool too small for the run), become NotApplicable naming `replay`."""
    try:
        with tempfile.TemporaryDirectory(prefix="kvscope-advisor-") as directory:
            yield Path(directory)
    except VllmUnavailable:
        raise NotApplicable(
            "it replays the run through vLLM's own KV cache manager, and this environment has "
            "no vLLM kvscope supports"
        ) from None
    except (ValueError, StoreError) as error:
        raise NotApplicable(f"{replay} cannot hold this run: {error}") from None
