"""The doctor's trial (doctor_checks.py): two requests sharing a prefix through vLLM's own
`KVCacheManager`, built on the CPU, with kvscope's hooks attached or none; the records must
count what vLLM counts itself. And vLLM's own KV events from such a trial, through the
collector's decoder."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from collector.commands.doctor_check import FAIL, OK, REPORT, Check
from collector.replay.block_manager import (
    CacheSettings,
    make_block_hasher,
    make_kv_cache_manager,
    make_request,
)
from collector.vllm_kv.wire import decode_batch, num_rows
from engine_hooks.buffer import EventBuffer
from engine_hooks.events import Allocate, Free, Hit, Lookup, Store, decoder, encoder, num_blocks
from engine_hooks.hooks import KVCacheHooks
from engine_hooks.privacy import Pseudonymizer

BLOCK_SIZE = 16  # tokens a block holds in the trials
NUM_BLOCKS = 256  # the trials' pool: room for every layout's groups
SHARED_BLOCKS = 2  # the prefix the two requests of a trial share
TAIL_TOKENS = 8  # each request's own tokens after it


class TrialError(RuntimeError):
    """vLLM's own manager did not take a trial's request; the message says where."""


@dataclass(frozen=True)
class Trial:
    """What kvscope's hooks recorded in a trial, and what vLLM counted itself."""

    records: list[Any]  # kvscope's records (engine_hooks.events)
    vllm_events: list[Any]  # vLLM's own KV events
    queries: int  # vLLM's PrefixCacheStats: requests looked up, and the tokens they hit
    hit_tokens: int
    seconds: float
    failure: str | None  # the hooks' own failure (capture stopped), if any


def _hasher() -> Callable[[Any], list[Any]]:
    return make_block_hasher(CacheSettings(block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS))


def _trial(manager: Any, with_hooks: bool) -> Trial:
    """Two requests sharing SHARED_BLOCKS blocks, through the calls vLLM's scheduler makes:
    each admitted in a step of its own (a Mamba group reuses only earlier steps' states), its
    prefill cut at its last block boundary (as the scheduler cuts it for a Mamba group), then
    both freed; with kvscope's hooks attached for the trial (`with_hooks`), or none.

    Raises what vLLM or the hooks raise where they cannot be built or attached, and
    `TrialError` where vLLM's manager refuses a request."""
    hasher = _hasher()
    shared = list(range(1, SHARED_BLOCKS * BLOCK_SIZE + 1))
    requests = [
        make_request(
            f"doctor-{n}", shared + [1000 * (n + 1) + t for t in range(TAIL_TOKENS)], hasher
        )
        for n in range(2)
    ]
    buffer = EventBuffer()
    started = time.perf_counter()
    # A throwaway key: the doctor reads no secret and makes none.
    hooks = (
        KVCacheHooks(manager, buffer, pseudonymizer=Pseudonymizer(os.urandom(32))).attach()
        if with_hooks
        else None
    )
    try:
        for request in requests:
            manager.new_step_starts()
            blocks, num_hits = manager.get_computed_blocks(request)[:2]
            boundary = request.num_tokens // BLOCK_SIZE * BLOCK_SIZE
            first = boundary - num_hits if boundary > num_hits else request.num_tokens - num_hits
            if manager.allocate_slots(request, first, num_hits, blocks) is None:
                raise TrialError(f"vLLM found no room for {request.request_id}'s prefill")
            manager.record_prefix_cache_stats(request, num_hits)
            request.num_computed_tokens = num_hits + first
            rest = request.num_tokens - request.num_computed_tokens
            if rest and manager.allocate_slots(request, rest) is None:
                raise TrialError(f"vLLM found no room for the rest of {request.request_id}")
            request.num_computed_tokens = request.num_tokens
        for request in requests:
            manager.free(request)
    finally:
        if hooks is not None:
            hooks.detach()
    seconds = time.perf_counter() - started
    stats = manager.make_prefix_cache_stats()
    return Trial(
        records=buffer.take(),
        vllm_events=list(manager.take_events()),
        queries=int(stats.requests),
        hit_tokens=int(stats.hits),
        seconds=seconds,
        failure=None if hooks is None else hooks.failure,
    )


def record_counts(trial: Trial) -> Counter[str]:
    """Blocks per kind of block record, and lookups and their hit tokens."""
    counts: Counter[str] = Counter()
    for record in trial.records:
        if isinstance(record, Lookup):
            counts["lookups"] += 1
            counts["lookup hit tokens"] += record.num_hit_tokens
        elif isinstance(record, Allocate | Store | Hit | Free):
            counts[type(record).__name__.lower()] += num_blocks(record)
    return counts


def disagreements(trial: Trial) -> list[str]:
    """Where kvscope's records of a trial disagree with what vLLM counted itself, or with
    themselves; [] when they agree."""
    if trial.failure is not None:
        return [f"a hook failed, and capture stopped: {trial.failure}"]
    counts = record_counts(trial)
    stored = sum(
        len(event.block_hashes)
        for event in trial.vllm_events
        if type(event).__name__ == "BlockStored"
    )
    problems = []
    if trial.hit_tokens == 0:
        problems.append("vLLM found no prefix hit for two requests sharing a prefix")
    if counts["lookups"] != trial.queries:
        problems.append(f"{counts['lookups']} lookups recorded, vLLM counted {trial.queries}")
    if counts["lookup hit tokens"] != trial.hit_tokens:
        problems.append(
            f"lookups hit {counts['lookup hit tokens']} tokens, vLLM counted {trial.hit_tokens}"
        )
    if counts["hit"] == 0 and trial.hit_tokens:
        problems.append("no hit recorded")
    if counts["store"] != stored:
        problems.append(f"{counts['store']} blocks stored, vLLM's KV events say {stored}")
    if counts["free"] != counts["allocate"] + counts["hit"]:
        problems.append(
            f"{counts['free']} blocks freed, the requests held {counts['allocate']} allocated "
            f"and {counts['hit']} hit"
        )
    if len(decoder().decode(encoder().encode(trial.records))) != len(trial.records):
        problems.append("the records do not survive the collector's wire format")
    return problems


def attempt(build: Callable[[], Any], with_hooks: bool) -> Trial | str:
    """The trial on the manager `build` makes, or why it could not run (what vLLM or the
    hooks raised)."""
    try:
        return _trial(build(), with_hooks)
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def capture_check() -> Check:
    """The plugin's work, for real: hooks on vLLM's own manager, one full-attention group."""
    settings = CacheSettings(block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS)
    trial = attempt(lambda: make_kv_cache_manager(settings, kv_events=True), True)
    if isinstance(trial, str):
        return Check(FAIL, "capture", f"the hooks cannot run on vLLM's manager: {trial}", REPORT)
    problems = disagreements(trial)
    if problems:
        return Check(
            FAIL, "capture", "the hooks' records are wrong: " + "; ".join(problems), REPORT
        )
    counts = record_counts(trial)
    milliseconds = trial.seconds * 1000
    return Check(
        OK,
        "capture",
        f"hooks on vLLM's own KVCacheManager (CPU, {BLOCK_SIZE}-token blocks), 2 requests "
        f"sharing {SHARED_BLOCKS} blocks: {counts['allocate']} blocks allocated, "
        f"{counts['store']} stored, {counts['hit']} hit, {counts['free']} freed, "
        f"{counts['lookups']} lookups, as vLLM counts them (prefix-cache stats, KV events); "
        f"no hook failed; {milliseconds:.1f} ms",
        figures={"trial_ms": round(milliseconds, 2), **counts},
    )


# -- vLLM's own KV events ------------------------------------------------------------------


def kv_events_check() -> Check:
    """A batch of vLLM's own KV events from a real manager, encoded as vLLM's publisher
    encodes it, read back by the collector's decoder (`kvscope collect --vllm-kv-events`)."""
    settings = CacheSettings(block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS)
    trial = attempt(lambda: make_kv_cache_manager(settings, kv_events=True), False)
    if isinstance(trial, str):
        return Check(
            FAIL,
            "KV events",
            f"vLLM's own manager, without kvscope, fails two plain requests: {trial}",
            "reinstall this vLLM, or use one in kvscope's support window",
        )
    events = trial.vllm_events
    try:
        from vllm.distributed.kv_events import KVEventBatch  # noqa: PLC0415 - vLLM loads torch (seconds); only what drives vLLM pays

        payload = msgspec.msgpack.Encoder().encode(
            KVEventBatch(ts=time.time(), events=events, data_parallel_rank=0)
        )
        batch = decode_batch(payload)
    except Exception as error:
        return Check(
            FAIL,
            "KV events",
            f"vLLM's KV events cannot be read here: {type(error).__name__}: {error}",
            "`kvscope collect --vllm-kv-events` will not read this vLLM's events; " + REPORT,
        )
    blocks = sum(len(getattr(event, "block_hashes", ())) for event in events)
    if not events or len(batch.events) != len(events) or num_rows(batch) != blocks:
        return Check(
            FAIL,
            "KV events",
            f"vLLM sent {len(events)} events of {blocks} blocks; kvscope read "
            f"{len(batch.events)} events of {num_rows(batch)} blocks",
            REPORT,
        )
    kinds = ", ".join(
        f"{count} {kind}"
        for kind, count in Counter(type(event).__name__ for event in events).items()
    )
    return Check(
        OK,
        "KV events",
        f"vLLM's own events from its manager ({kinds}: {blocks} blocks), in a "
        "KVEventBatch encoded as its publisher does, read back whole by `kvscope collect "
        "--vllm-kv-events`",
    )
