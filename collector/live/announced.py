"""What an engine's batch header announces of it (every batch carries the engine's cache
settings, `engine_hooks.transport.EngineSettings`): the run's config, when its batch begins
the run (`run_config`), and the settings the run keeps of each engine (`keep_settings`), so
that an engine that restarted with another block size, hash algorithm or model is named as
such (collector/queries/fleet.py, `engine_starts`), and each engine's stop (`keep_stop`)."""

from __future__ import annotations

import json

import msgspec

from collector.store.lookup_causes import ENGINE_STOP_KEY
from collector.store.run_file import RunConfig, RunStore
from engine_hooks.transport import BatchHeader

# The `meta` key of an engine's settings: "engine_settings ENGINE dpRANK"; its value is the
# header's settings as JSON, with the engine's id and DP rank.
SETTINGS_KEY = "engine_settings"


def run_config(header: BatchHeader) -> RunConfig:
    settings = header.config
    return RunConfig(
        source="engine",
        trace=None,
        timing=None,
        block_size=settings.block_size,
        num_blocks=settings.num_blocks,
        hash_algo=settings.hash_algo,
        vllm_version=settings.vllm_version,
        max_num_seqs=settings.max_num_seqs or None,
        options={
            "engine_id": header.engine_id,
            "model": settings.model,
            "check_collisions": settings.check_collisions,
            "record_token_ids": settings.record_token_ids,
            "kv_groups": msgspec.to_builtins(settings.kv_groups),
        },
    )


def keep_settings(store: RunStore, header: BatchHeader, announced_id: str) -> None:
    """Keep the header's engine settings in the run's `meta` (one key per engine and DP rank;
    a resumed collector writes the same again), with the engine start they came from: the
    id the hooks sent (`announced_id`: the header's is the run's name of that start, "ID #2"
    for an engine started again under its id) and its `started_ns`."""
    value = {
        "engine_id": header.engine_id,
        "dp_rank": header.dp_rank,
        "announced_id": announced_id,
        "started_ns": header.started_ns,
        **msgspec.to_builtins(header.config),
    }
    store.row(
        "INSERT OR REPLACE INTO meta VALUES (?, ?)",
        [
            f"{SETTINGS_KEY} {header.engine_id} dp{header.dp_rank}",
            json.dumps(value, sort_keys=True),
        ],
    )


def keep_stop(store: RunStore, header: BatchHeader, end_seq: int, last_ts_ns: int) -> None:
    """Keep an engine's stop, which its closing batch announced (`header.stopped_ns`), in the
    run's `meta` (ENGINE_STOP_KEY; JSON: the engine's id and DP rank, `seq`, `stopped_ns`):
    where its stream ended (`end_seq`) and when, never before its last record (`last_ts_ns`):
    the cache it held is gone from then on."""
    value = {
        "engine_id": header.engine_id,
        "dp_rank": header.dp_rank,
        "seq": end_seq,
        "stopped_ns": max(header.stopped_ns, last_ts_ns),
    }
    store.row(
        "INSERT OR REPLACE INTO meta VALUES (?, ?)",
        [
            f"{ENGINE_STOP_KEY} {header.engine_id} dp{header.dp_rank}",
            json.dumps(value, sort_keys=True),
        ],
    )


def kept_starts(store: RunStore) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """The engine starts the run's `meta` kept (keep_settings): ((the run's engine id, DP
    rank), (the id the hooks sent, their `started_ns`)) for each engine whose hooks sent one,
    so that a resumed collector takes each start's batches as the collector before did."""
    starts = []
    for (text,) in store.rows(
        "SELECT value FROM meta WHERE key LIKE ? ORDER BY key", [f"{SETTINGS_KEY} %"]
    ):
        value = json.loads(text)
        if value.get("started_ns"):
            engine = (str(value["engine_id"]), int(value["dp_rank"]))
            starts.append((engine, (str(value["announced_id"]), int(value["started_ns"]))))
    return starts
