"""Prometheus metrics of a live run: a custom Collector over `LiveState`, registry passed in."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from collector.live.live_state import EVICTED_HASHES, Engine, LiveState

_BLOCK_STATES = ("free", "cached_free", "in_use")


class KvscopeMetrics(Collector):
    """Builds fresh metric families from the live state at every scrape."""

    def __init__(self, state: LiveState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        with self.state.lock:
            yield from self._request_metrics()
            yield from self._pool_metrics()
            yield from self._block_counters()
            yield self._dropped_records()
            yield from self._engine_metrics()

    def _pool_metrics(self) -> Iterator[Metric]:
        state = self.state
        total_queries = sum(state.query_tokens.values())
        ratio = GaugeMetricFamily(
            "kvscope_prefix_cache_hit_ratio",
            "Prefix-cache hit tokens / looked-up tokens over the run so far (no sample "
            "before the first lookup: not 0).",
        )
        if total_queries:  # before any lookup there is no ratio, and 0.0 would read as one
            ratio.add_metric([], sum(state.hit_tokens.values()) / total_queries)
        yield ratio
        blocks = GaugeMetricFamily(
            "kvscope_kv_cache_blocks",
            "KV cache blocks by state after the latest scheduler step (free includes "
            "cached_free; the null block is not counted).",
            labels=["engine", "dp_rank", "state"],
        )
        for (engine, dp_rank), values in sorted(state.pool.items()):
            free, cached_free, in_use = values
            for name, value in zip(_BLOCK_STATES, (free, cached_free, in_use), strict=True):
                blocks.add_metric([engine, str(dp_rank), name], value)
        yield blocks
        yield _per_engine(
            GaugeMetricFamily(
                "kvscope_kv_cache_pool_blocks",
                "Usable KV cache blocks in the engine's pool, free and in use together (the "
                "null block is not counted).",
                labels=["engine", "dp_rank"],
            ),
            state.pool_blocks,
        )

    def _block_counters(self) -> Iterator[Metric]:
        state = self.state
        for name, documentation, value in (
            ("kvscope_block_hits", "Cached blocks reused by requests.", state.block_hits),
            (
                "kvscope_block_stores",
                "Blocks whose hash entered the prefix cache.",
                state.block_stores,
            ),
            (
                "kvscope_block_evictions",
                "Cached blocks evicted for reuse.",
                state.block_evictions,
            ),
            (
                "kvscope_block_recomputes",
                "Blocks stored again after the same engine evicted their hash: a prefix "
                f"computed twice (evictions older than the last {EVICTED_HASHES:,} are not "
                "remembered).",
                state.block_recomputes,
            ),
            (
                "kvscope_collisions",
                "Prefix hits that served another prompt's KV.",
                state.collisions,
            ),
            (
                "kvscope_missing_records",
                "Records the collector never received (gaps in sequence numbers).",
                state.missing_records,
            ),
        ):
            counter = CounterMetricFamily(name, documentation)
            counter.add_metric([], value)
            yield counter

    def _dropped_records(self) -> Metric:
        state = self.state
        dropped = CounterMetricFamily(
            "kvscope_engine_dropped_records",
            "Records an engine dropped: its buffer was full, or the collector was absent or slow.",
            labels=["engine", "dp_rank", "stage"],
        )
        for (engine, dp_rank), (in_buffer, in_transport) in sorted(state.engine_dropped.items()):
            dropped.add_metric([engine, str(dp_rank), "buffer"], in_buffer)
            dropped.add_metric([engine, str(dp_rank), "transport"], in_transport)
        return dropped

    def _engine_metrics(self) -> Iterator[Metric]:
        state = self.state
        yield _per_engine(
            GaugeMetricFamily(
                "kvscope_engine_last_record_timestamp_seconds",
                "When the collector last stored records of the engine (Unix time).",
                labels=["engine", "dp_rank"],
            ),
            state.last_record_s,
        )
        yield _per_engine(
            GaugeMetricFamily(
                "kvscope_engine_requests_in_flight",
                "Requests the engine admitted and had not finished, as of its latest record.",
                labels=["engine", "dp_rank"],
            ),
            state.in_flight,
        )

    def _request_metrics(self) -> Iterator[Metric]:
        state = self.state
        for name, documentation, counts in (
            (
                "kvscope_prefix_cache_requests",
                "Requests admitted (first admissions).",
                state.requests,
            ),
            (
                "kvscope_prefix_cache_query_tokens",
                "Prompt tokens looked up in the prefix cache.",
                state.query_tokens,
            ),
            (
                "kvscope_prefix_cache_hit_tokens",
                "Prompt tokens served from the prefix cache.",
                state.hit_tokens,
            ),
        ):
            family = CounterMetricFamily(name, documentation, labels=["tenant", "lora"])
            for (tenant, lora), value in sorted(counts.items()):
                family.add_metric([tenant, lora], value)
            yield family


def _per_engine(family: GaugeMetricFamily, values: Mapping[Engine, float]) -> GaugeMetricFamily:
    for (engine, dp_rank), value in sorted(values.items()):
        family.add_metric([engine, str(dp_rank)], value)
    return family


def serve_metrics(
    state: LiveState, port: int, registry: CollectorRegistry | None = None
) -> CollectorRegistry:
    """Register the metrics in `registry` (a fresh one by default) and serve them on 127.0.0.1."""
    registry = registry or CollectorRegistry()
    registry.register(KvscopeMetrics(state))
    start_http_server(port, addr="127.0.0.1", registry=registry)
    return registry
