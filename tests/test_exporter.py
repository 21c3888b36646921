"""The Prometheus exporter: exact exposition text from a fresh registry."""

from __future__ import annotations

import msgspec
from prometheus_client import CollectorRegistry, generate_latest

from collector.live.exporter import KvscopeMetrics
from collector.live.live_state import EVICTED_HASHES, LiveState
from engine_hooks.events import Evict, Store, pack_counts
from tests.support.live_records import HEADER, RECORDS

EXPECTED = """\
# HELP kvscope_prefix_cache_requests_total Requests admitted (first admissions).
# TYPE kvscope_prefix_cache_requests_total counter
kvscope_prefix_cache_requests_total{lora="",tenant="acme"} 1.0
kvscope_prefix_cache_requests_total{lora="sql",tenant="acme"} 1.0
# HELP kvscope_prefix_cache_query_tokens_total Prompt tokens looked up in the prefix cache.
# TYPE kvscope_prefix_cache_query_tokens_total counter
kvscope_prefix_cache_query_tokens_total{lora="",tenant="acme"} 64.0
kvscope_prefix_cache_query_tokens_total{lora="sql",tenant="acme"} 48.0
# HELP kvscope_prefix_cache_hit_tokens_total Prompt tokens served from the prefix cache.
# TYPE kvscope_prefix_cache_hit_tokens_total counter
kvscope_prefix_cache_hit_tokens_total{lora="",tenant="acme"} 32.0
kvscope_prefix_cache_hit_tokens_total{lora="sql",tenant="acme"} 0.0
# HELP kvscope_prefix_cache_hit_ratio Prefix-cache hit tokens / looked-up tokens over the run so far (no sample before the first lookup: not 0).
# TYPE kvscope_prefix_cache_hit_ratio gauge
kvscope_prefix_cache_hit_ratio 0.2857142857142857
# HELP kvscope_kv_cache_blocks KV cache blocks by state after the latest scheduler step (free includes cached_free; the null block is not counted).
# TYPE kvscope_kv_cache_blocks gauge
kvscope_kv_cache_blocks{dp_rank="0",engine="node-1",state="free"} 10.0
kvscope_kv_cache_blocks{dp_rank="0",engine="node-1",state="cached_free"} 4.0
kvscope_kv_cache_blocks{dp_rank="0",engine="node-1",state="in_use"} 20.0
# HELP kvscope_kv_cache_pool_blocks Usable KV cache blocks in the engine's pool, free and in use together (the null block is not counted).
# TYPE kvscope_kv_cache_pool_blocks gauge
kvscope_kv_cache_pool_blocks{dp_rank="0",engine="node-1"} 30.0
# HELP kvscope_block_hits_total Cached blocks reused by requests.
# TYPE kvscope_block_hits_total counter
kvscope_block_hits_total 2.0
# HELP kvscope_block_stores_total Blocks whose hash entered the prefix cache.
# TYPE kvscope_block_stores_total counter
kvscope_block_stores_total 2.0
# HELP kvscope_block_evictions_total Cached blocks evicted for reuse.
# TYPE kvscope_block_evictions_total counter
kvscope_block_evictions_total 1.0
# HELP kvscope_block_recomputes_total Blocks stored again after the same engine evicted their hash: a prefix computed twice (evictions older than the last 65,536 are not remembered).
# TYPE kvscope_block_recomputes_total counter
kvscope_block_recomputes_total 0.0
# HELP kvscope_collisions_total Prefix hits that served another prompt's KV.
# TYPE kvscope_collisions_total counter
kvscope_collisions_total 1.0
# HELP kvscope_missing_records_total Records the collector never received (gaps in sequence numbers).
# TYPE kvscope_missing_records_total counter
kvscope_missing_records_total 2.0
# HELP kvscope_engine_dropped_records_total Records an engine dropped: its buffer was full, or the collector was absent or slow.
# TYPE kvscope_engine_dropped_records_total counter
kvscope_engine_dropped_records_total{dp_rank="0",engine="node-1",stage="buffer"} 3.0
kvscope_engine_dropped_records_total{dp_rank="0",engine="node-1",stage="transport"} 5.0
# HELP kvscope_engine_last_record_timestamp_seconds When the collector last stored records of the engine (Unix time).
# TYPE kvscope_engine_last_record_timestamp_seconds gauge
kvscope_engine_last_record_timestamp_seconds{dp_rank="0",engine="node-1"} 1.7672256e+09
# HELP kvscope_engine_requests_in_flight Requests the engine admitted and had not finished, as of its latest record.
# TYPE kvscope_engine_requests_in_flight gauge
kvscope_engine_requests_in_flight{dp_rank="0",engine="node-1"} 1.0
"""


def test_exposition_text_is_exact() -> None:
    state = LiveState(clock=lambda: 1_767_225_600.0)  # 2026-01-01 00:00 UTC
    state.observe(HEADER, RECORDS)
    registry = CollectorRegistry()
    registry.register(KvscopeMetrics(state))
    assert generate_latest(registry).decode() == EXPECTED


def test_an_engines_stop_ends_its_gauges_and_keeps_the_counts() -> None:
    """The closing batch an engine sends as it shuts down (`stopped_ns`): its pool, in-flight
    and last-record series end (the alerts on them resolve), the run's counts stand."""
    state = LiveState(clock=lambda: 1_767_225_600.0)
    state.observe(HEADER, RECORDS)
    state.observe(msgspec.structs.replace(HEADER, stopped_ns=5_000), [])
    registry = CollectorRegistry()
    registry.register(KvscopeMetrics(state))
    text = generate_latest(registry).decode()
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    ended = [line for line in EXPECTED.splitlines() if line not in samples]
    assert [line.split("{")[0] for line in ended if not line.startswith("#")] == [
        "kvscope_kv_cache_blocks",
        "kvscope_kv_cache_blocks",
        "kvscope_kv_cache_blocks",
        "kvscope_kv_cache_pool_blocks",
        "kvscope_engine_last_record_timestamp_seconds",
        "kvscope_engine_requests_in_flight",
    ]
    assert "kvscope_block_hits_total 2.0" in samples
    assert (
        'kvscope_engine_dropped_records_total{dp_rank="0",engine="node-1",stage="buffer"} 3.0'
        in samples
    )


def test_empty_state_exposes_zero_counts_and_no_ratio() -> None:
    registry = CollectorRegistry()
    registry.register(KvscopeMetrics(LiveState()))
    text = generate_latest(registry).decode()
    # Before the collector's first batch there is no hit ratio to show (0.0 would read as
    # one): the gauge is declared, with no sample.
    assert "# TYPE kvscope_prefix_cache_hit_ratio gauge\n" in text
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert not [line for line in samples if line.startswith("kvscope_prefix_cache_hit_ratio")]
    assert "kvscope_block_hits_total 0.0\n" in text
    assert "kvscope_kv_cache_blocks{" not in text


def _evict(seq: int, block_hashes: list[bytes]) -> Evict:
    return Evict(
        seq, seq, None, pack_counts(list(range(len(block_hashes)))), b"".join(block_hashes)
    )


def _store(seq: int, block_hashes: list[bytes]) -> Store:
    ids = pack_counts(list(range(len(block_hashes))))
    return Store(seq, seq, "r", ids, b"".join(block_hashes), None, 0, 16)


def test_a_store_of_a_hash_the_engine_evicted_is_a_recompute_once() -> None:
    state = LiveState()
    state.observe(
        HEADER, [_evict(0, [b"prefix-1", b"prefix-2"]), _store(1, [b"prefix-1", b"new-3333"])]
    )
    assert (state.block_stores, state.block_evictions, state.block_recomputes) == (2, 2, 1)
    state.observe(HEADER, [_store(2, [b"prefix-1"])])  # cached since its recompute: not again
    other_engine = msgspec.structs.replace(HEADER, engine_id="node-2")
    state.observe(other_engine, [_store(3, [b"prefix-2"])])  # another engine's hash space
    assert state.block_recomputes == 1
    state.observe(HEADER, [_store(4, [b"prefix-2"])])
    assert state.block_recomputes == 2


def test_evicted_hashes_are_remembered_up_to_a_bound() -> None:
    state = LiveState()
    hashes = [index.to_bytes(8, "little") for index in range(EVICTED_HASHES + 10)]
    state.observe(HEADER, [_evict(0, hashes)])
    state.observe(HEADER, [_store(1, hashes)])
    # The ten oldest evictions were forgotten: only the last EVICTED_HASHES count.
    assert state.block_recomputes == EVICTED_HASHES
