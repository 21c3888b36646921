"""vLLM 0.34's cache-aware admission (`--cache-aware-admission-window`): the scheduler probes
the prefix cache of waiting requests (`KVCacheManager.get_num_cached_tokens`) to move those
with a cached prefix first. A probe is not a lookup: it takes no blocks and vLLM counts no
query, so kvscope records none; its lookups and hits stay exactly vLLM's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine_hooks.buffer import EventBuffer
from engine_hooks.events import Lookup
from engine_hooks.hooks import KVCacheHooks
from engine_hooks.privacy import Pseudonymizer
from engine_hooks.scheduler_hooks import SchedulerHooks
from tests.support.engine import BLOCK_SIZE, drive, make_scheduler, workload

pytestmark = pytest.mark.vllm  # drives vLLM's own code: runs on every supported version


def test_cache_probes_are_not_counted_as_lookups(tmp_path: Path) -> None:
    scheduler = make_scheduler(tmp_path / "model", BLOCK_SIZE, num_blocks=400, max_num_seqs=4)
    if not hasattr(scheduler, "cache_aware_window"):
        pytest.skip("this vLLM has no cache-aware admission (new in 0.34)")
    # What `--cache-aware-admission-window 16 --cache-aware-admission-threshold 0` set.
    scheduler.cache_aware_window = 16
    scheduler.cache_aware_threshold = 0.0
    manager = scheduler.kv_cache_manager
    probes: list[int] = []
    probe = manager.get_num_cached_tokens

    def counted_probe(request: Any) -> int:
        tokens: int = probe(request)
        probes.append(tokens)
        return tokens

    manager.get_num_cached_tokens = counted_probe
    buffer = EventBuffer(1 << 20)
    hooks = KVCacheHooks(manager, buffer, pseudonymizer=Pseudonymizer(b"probe-test"))
    SchedulerHooks(scheduler, hooks, lambda request: None).attach()

    result = drive(scheduler, workload()[:150], per_step=12)

    lookups = [record for record in buffer.take() if isinstance(record, Lookup)]
    assert hooks.failure is None
    assert sum(tokens > 0 for tokens in probes) > 10, "the scheduler probed cached prefixes"
    assert len(probes) > len(lookups), "more probes than lookups: a probe is no lookup"
    assert len(lookups) == result.finished == 150, "one lookup per admission, none per probe"
    # vLLM's PrefixCacheStats count tokens: looked up and hit, first admissions and resumed
    assert sum(record.num_prompt_tokens for record in lookups) == (
        result.queries + result.preempted_queries
    )
    assert sum(record.num_hit_tokens for record in lookups) == result.hits + result.preempted_hits
