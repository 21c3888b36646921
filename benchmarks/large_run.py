"""A run of more than 100 million event rows: its file size, every page's query time, and
what one live refresh of it costs.

The run is built once (about 20 minutes here) under --cache (default /tmp/kvscope-bench)
and never committed:
1. A fleet replay: the sample workload (`kvscope generate`) drawn --copies times with
   different seeds, laid end to end on the clock (as benchmarks/app_queries.py draws it),
   replayed through --engines real vLLM KV cache managers behind the round-robin router
   (sequential timing, block size 16, 2,400 blocks an engine, token ids recorded).
2. That fleet stacked --stack times into one run, as --stack collectors of --engines engines
   each, serving different documents of the same shape: group g's engines are renamed
   `engine-{g * engines + i}`, its request ids prefixed `g{g}-`, and its block hashes (and
   parents, and the hashes of `block_tokens` and `collisions`) XOR-ed with a key of its own,
   so no group shares a cached block with another; rows are inserted in time order, as one
   collector receiving every engine's stream writes them. kvscope's own code then derives
   `requests`, the rollups and the eviction ages from all of it (`RunStore.finalize`).
Replaying all of it through vLLM instead (--stack 1 --copies 1000) takes about an hour on
the 2-core build machine; the stacked run's rows have the same shape and the same order.

Then it prints the run file's size and row counts; the seconds of every app page's collector
calls (pages whose figures need a replay, Advisor and Cache policies, report the time of that
replay), over the whole run and over its middle 80 %, the coldest of --rounds rounds; and a
live refresh of a copy of the run resumed as a restarted collector resumes it, part by part:
with nothing new, with --new-rows event rows new (the run's last rows again, moved on in
record number and time), and with a live copy made.

    python benchmarks/large_run.py [--copies 100] [--engines 4] [--stack 10] [--rounds 2]
        [--build-only | --pages-only | --refresh-only] [--new-rows 5000]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import time
from dataclasses import replace
from pathlib import Path

import duckdb
from app_queries import OPTIONS, SECRET, Call, time_pages, workload_trace
from live_refresh import WORKER, TimedCopies, Timings, timed_refresh

from collector.advisor import RunContext, advise
from collector.advisor.curves import whatif_curves
from collector.live.receiver import INGEST_MEMORY_LIMIT, INGEST_THREADS
from collector.model.kv_memory import MODELS, gib_for_blocks
from collector.model.policies import ReplayTooLarge
from collector.model.policy_curves import policy_curves
from collector.model.time_window import TimeWindow
from collector.queries import fleet, kv_groups, vllm_kv
from collector.queries.fleet import num_engines
from collector.queries.summary import run_summary
from collector.replay.replayer import replay
from collector.store.run_file import RunConfig, RunFile, RunStore, live_copy_path
from collector.store.schema import CREATE_STATEMENTS, DERIVED_STATEMENTS, SCHEMA_VERSION

FLEET = replace(OPTIONS, timing="sequential", router="round-robin")
# The tables a collector writes row by row; every other table is derived from them.
RECORDED = ("events", "pool", "collisions", "block_tokens", "request_tokens")
SLICES = 100


def layout_key() -> str:
    return hashlib.sha256("".join(CREATE_STATEMENTS + DERIVED_STATEMENTS).encode()).hexdigest()[:8]


def build_fleet(cache: Path, copies: int, engines: int) -> Path:
    """The fleet replay of step 1, replayed once and reused while the run-file layout holds."""
    run = cache / f"large-fleet-schema{SCHEMA_VERSION}-{layout_key()}-{copies}x{engines}.duckdb"
    if not run.exists():
        trace = workload_trace(cache, copies)
        print(f"replaying {trace} across {engines} engines into {run} (once)", flush=True)
        started = time.perf_counter()
        temporary = run.with_name(f".{run.name}.building")
        temporary.unlink(missing_ok=True)
        replay(trace, temporary, replace(FLEET, engines=engines), SECRET)
        temporary.rename(run)
        print(f"replayed in {time.perf_counter() - started:.0f} s", flush=True)
    return run


def build_stacked(fleet: Path, engines: int, stack: int) -> Path:
    """Step 2: `stack` groups of the fleet's engines in one run, derived tables built by
    kvscope; built once."""
    run = fleet.with_name(fleet.stem.replace("large-fleet", "large-run") + f"-stack{stack}.duckdb")
    if run.exists():
        return run
    temporary = run.with_name(f".{run.name}.building")
    temporary.unlink(missing_ok=True)
    settings = FLEET.settings
    config = RunConfig(
        "replay", settings.block_size, settings.num_blocks, settings.hash_algo, "benchmark"
    )
    started = time.perf_counter()
    RunStore.create(temporary, config).close()  # the schema; the runs row is the fleet's
    connection = duckdb.connect(str(temporary), config={"memory_limit": "6GB"})
    connection.execute(f"ATTACH '{fleet}' AS fleet (READ_ONLY)")
    connection.execute("DELETE FROM runs")
    connection.execute("INSERT INTO runs SELECT * FROM fleet.runs")
    for table in RECORDED:
        stack_table(connection, table, engines, stack)
        print(f"  stacked {table}: {time.perf_counter() - started:.0f} s", flush=True)
    connection.close()
    store = RunStore.open(temporary, read_only=False)
    store.limit_memory(INGEST_MEMORY_LIMIT)  # DuckDB's default took 19.7 of 24 GB here
    derived = time.perf_counter()
    store.finalize()
    store.close()
    print(
        f"stacked in {time.perf_counter() - started:.0f} s, of which kvscope's derived tables "
        f"(RunStore.finalize) {time.perf_counter() - derived:.0f} s",
        flush=True,
    )
    temporary.rename(run)
    return run


def stack_table(
    connection: duckdb.DuckDBPyConnection, table: str, engines: int, stack: int
) -> None:
    """Insert `stack` groups' copies of the attached fleet's `table`, in time order."""
    columns = [row[0] for row in connection.execute(f"DESCRIBE {table}").fetchall()]
    groups = " UNION ALL ".join(
        f"SELECT {', '.join(_stacked(column, group, engines) for column in columns)} "
        f"FROM fleet.{table}"
        for group in range(stack)
    )
    span = f"SELECT min(ts_ns), max(ts_ns) FROM fleet.{table}" if "ts_ns" in columns else ""
    first, last = (connection.execute(span).fetchone() if span else None) or (None, None)
    if first is None or last is None:
        connection.execute(f"INSERT INTO {table} {groups}")
        return
    step = (last - first) // SLICES + 1  # a slice at a time: one sort of it all takes ~20 GB
    for start in range(first, last + 1, step):
        connection.execute(
            f"INSERT INTO {table} SELECT * FROM ({groups}) "
            f"WHERE ts_ns >= {start} AND ts_ns < {start + step} "
            "ORDER BY ts_ns, engine_id, seq"
        )


def _stacked(column: str, group: int, engines: int) -> str:
    """Column `column` of group `group`'s copy of a row."""
    key = int.from_bytes(hashlib.sha256(f"group {group}".encode()).digest()[:8], "big")
    if column in ("block_hash", "parent_hash"):
        return f"xor({column}, {key}::UBIGINT) AS {column}"
    if column == "engine_id":
        number = f"CAST(split_part(engine_id, '-', 2) AS INTEGER) + {group * engines}"
        return f"'engine-' || CAST({number} AS VARCHAR) AS engine_id"
    if column == "request_id":
        return f"'g{group}-' || request_id AS request_id"
    return column


def describe(run: Path, store: RunFile) -> None:
    """The run file's size and its tables' rows."""
    tables = [row[0] for row in store.rows("SELECT table_name FROM duckdb_tables() ORDER BY 1")]
    counts = {name: int((store.row(f"SELECT count(*) FROM {name}") or (0,))[0]) for name in tables}
    summary = run_summary(store)
    print(
        f"{run}: {run.stat().st_size / 2**30:.2f} GiB, {summary['events']:,} events, "
        f"{summary['requests']:,} requests, {num_engines(store)} engines"
    )
    for name, count in counts.items():
        print(f"  {name:<24} {count:>14,} rows")


def more_page_calls(store: RunFile, run: Path, window: TimeWindow) -> dict[str, dict[str, Call]]:
    """The collector calls of the pages benchmarks/app_queries.py does not time."""
    gib_per_block = gib_for_blocks(MODELS[next(iter(MODELS))], 16, 1)
    return {
        "kv cache groups": {
            "layout": lambda: kv_groups.layout(store),
            "group_figures": lambda: kv_groups.group_figures(store, window),
            "cut_short": lambda: kv_groups.cut_short(store, window),
            "in_use_timeline": lambda: kv_groups.in_use_timeline(store, window),
        },
        "fleet": {
            "num_engines": lambda: num_engines(store),
            "fleet_engines": lambda: fleet.fleet_engines(store, window),
            "duplication_summary": lambda: fleet.duplication_summary(store, gib_per_block, window),
            "free_share_timeline": lambda: fleet.free_share_timeline(store, window),
            "fleet_duplication": lambda: fleet.fleet_duplication(store, gib_per_block, window),
        },
        "vllm kv events": {
            "vllm_kv_summary": lambda: vllm_kv.vllm_kv_summary(store),
            "vllm_kv_activity": lambda: vllm_kv.vllm_kv_activity(store),
            "vllm_kv_tier_occupancy": lambda: vllm_kv.vllm_kv_tier_occupancy(store),
            "vllm_kv_gaps": lambda: vllm_kv.vllm_kv_gaps(store),
            "vllm_kv_conflicts": lambda: vllm_kv.vllm_kv_conflicts(store),
        },
    }


def replay_pages(store_path: Path) -> None:
    """The pages whose figures replay the run's requests: the time of those replays, once
    (each page caches its result per run file)."""
    print("\npages that replay the run (once; cached per run file)")
    with RunFile.open(store_path) as store:
        context = RunContext(store, store_path)
        started = time.perf_counter()
        try:
            if context.num_engines > 1:  # as the page: the policy replays model one pool
                raise ReplayTooLarge(f"{context.num_engines} engines")
            policy_curves(context.block_stream, context.block_size, context.num_blocks)
            outcome = "curves"
        except ReplayTooLarge as error:
            outcome = f"refused: {error}"
        print(f"  cache policies: {time.perf_counter() - started:.1f} s ({outcome})", flush=True)
        context = RunContext(store, store_path)
        started = time.perf_counter()
        advise(context)
        whatif_curves(context)
        print(f"  advisor: {time.perf_counter() - started:.1f} s", flush=True)


# The stream going on where the run stops: its last rows again, each record number moved
# past every engine's last and each time past the run's end; their evictions without the
# age and hits the fold fills.
_NEXT_ROWS = """
WITH tail AS (SELECT * FROM events WHERE rowid >= (SELECT count(*) FROM events) - $rows),
shift AS (
    SELECT (SELECT max(seq) FROM events) + 1 - min(seq) AS seq_by,
        max(ts_ns) - min(ts_ns) + 1 AS ts_by
    FROM tail
)
SELECT tail.* REPLACE (
    tail.seq + shift.seq_by AS seq,
    tail.ts_ns + shift.ts_by AS ts_ns,
    CASE WHEN kind = 'evict' THEN NULL ELSE age_ns END AS age_ns,
    CASE WHEN kind = 'evict' THEN NULL ELSE num_hits END AS num_hits
)
FROM tail, shift
"""


def live_refresh(run: Path, rounds: int, new_rows: int) -> None:
    """A live refresh of a copy of the run resumed as a restarted collector resumes it: with
    nothing new, with `new_rows` event rows new (the writer's insert, fold and checkpoint,
    as after a flush), and with a live copy made (the worker's copy and rebuild); part by
    part, per round."""
    work = run.with_name("large-run-live.duckdb")
    shutil.copyfile(run, work)
    with duckdb.connect(str(work)) as connection:  # a collector still writing it
        connection.execute("UPDATE runs SET finished_at = NULL")
    started = time.perf_counter()
    store = RunStore.resume(work)
    print(f"\nlive refresh of {run.name}: resumed in {time.perf_counter() - started:.2f} s")
    store.limit_threads(INGEST_THREADS)
    store.limit_memory(INGEST_MEMORY_LIMIT)
    store.checkpoint_only_when_asked()
    parts = timed_refresh(store, [], None)
    print(f"  first refresh (the whole file is new to this process): {_listed(parts)}")
    for _ in range(rounds):
        print(f"  nothing new: {_listed(timed_refresh(store, [], None))}")
        print(f"  {new_rows:,} new: {_listed(_timed_new_rows(store, new_rows, None))}", flush=True)
    copies = TimedCopies(store, INGEST_THREADS)
    print(f"  and a live copy: {_listed(timed_refresh(store, [], copies))}", flush=True)
    parts = _timed_new_rows(store, new_rows, copies)
    carried = "carried over" if copies.carried else "built whole"
    print(f"  {new_rows:,} new and the next live copy (tables {carried}): {_listed(parts)}")
    store.close()
    work.unlink()
    live_copy_path(work).unlink(missing_ok=True)


def _timed_new_rows(store: RunStore, new_rows: int, copies: TimedCopies | None) -> Timings:
    """Insert the next `new_rows` event rows as a flush does, then refresh (and copy)."""
    rows = store.arrow(_NEXT_ROWS, {"rows": new_rows})
    started = time.perf_counter()
    store.insert({"events": rows})
    inserted = {"insert (the new rows)": time.perf_counter() - started}
    return inserted | timed_refresh(store, [], copies)


def _listed(parts: dict[str, float]) -> str:
    writer = sum(seconds for part, seconds in parts.items() if not part.startswith(WORKER))
    listed = ", ".join(f"{name} {seconds:.2f}" for name, seconds in parts.items())
    return f"writer {writer:.2f} s ({listed})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--copies", type=int, default=100, help="sample workloads end to end")
    parser.add_argument("--engines", type=int, default=4, help="engines of the fleet replay")
    parser.add_argument("--stack", type=int, default=10, help="groups of those engines")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/kvscope-bench"))
    parser.add_argument("--build-only", action="store_true", help="build the run and stop")
    parser.add_argument(
        "--pages-only", action="store_true", help="time the pages and stop (no live refresh)"
    )
    parser.add_argument(
        "--refresh-only", action="store_true", help="time the live refresh only (no pages)"
    )
    parser.add_argument(
        "--new-rows", type=int, default=5_000, help="event rows new at each live refresh"
    )
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    fleet = build_fleet(args.cache, args.copies, args.engines)
    run = build_stacked(fleet, args.engines, args.stack) if args.stack > 1 else fleet
    if args.build_only:
        return
    if not args.refresh_only:
        sample = Path(__file__).resolve().parents[1] / "sample_data" / "run_block32.duckdb"
        store, second = RunStore.open(run), RunStore.open(sample)
        describe(run, store)
        time_pages(store, second, args.rounds, lambda window: more_page_calls(store, run, window))
        store.close()
        second.close()
    if args.pages_only:
        return
    live_refresh(run, args.rounds + 1, args.new_rows)
    if not args.refresh_only:
        replay_pages(store_path=run)


if __name__ == "__main__":
    main()
