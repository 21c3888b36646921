"""The Prometheus exporter: exact exposition text from a fresh registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from collector.live.exporter import KvscopeMetrics
from collector.live.live_state import LiveState
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
# HELP kvscope_block_hits_total Cached blocks reused by requests.
# TYPE kvscope_block_hits_total counter
kvscope_block_hits_total 2.0
# HELP kvscope_block_stores_total Blocks whose hash entered the prefix cache.
# TYPE kvscope_block_stores_total counter
kvscope_block_stores_total 2.0
# HELP kvscope_block_evictions_total Cached blocks evicted for reuse.
# TYPE kvscope_block_evictions_total counter
kvscope_block_evictions_total 1.0
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
"""


def test_exposition_text_is_exact() -> None:
    state = LiveState()
    state.observe(HEADER, RECORDS)
    registry = CollectorRegistry()
    registry.register(KvscopeMetrics(state))
    assert generate_latest(registry).decode() == EXPECTED


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
