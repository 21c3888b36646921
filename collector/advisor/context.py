"""Everything the rules read about one run, each piece computed once and only when asked.

A run of several engines (a fleet: engine id x DP rank) has one pool of `num_blocks` per
engine. Its curves are each engine's own, from that engine's requests in its order, summed
at every pool size per engine: a fleet's pool sizes are per engine throughout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from collector.advisor.miss_breakdown import MissBreakdown, read_breakdown
from collector.advisor.replay_cache import ReplayCache
from collector.advisor.scheduler_ratios import SchedulerCheck
from collector.advisor.suggestion import NotApplicable
from collector.model.block_stream import (
    Namespace,
    RequestBlocks,
    trace_block_stream,
    vllm_namespace,
)
from collector.model.kv_memory import MODELS, GpuMemory, KVSpec
from collector.model.mrc import MissRatioCurve, fleet_curve, miss_ratio_curve
from collector.model.trace_request import TraceRequest
from collector.queries.config import RecordedOptions, RunRow, recorded_options, run_config
from collector.queries.fleet import num_engines
from collector.queries.requests import (
    engine_block_streams,
    has_token_ids,
    request_engines,
    requests_from_run,
    run_block_stream,
)
from collector.queries.summary import RunSummary, run_summary
from collector.replay.sweep_results import SweepResult
from collector.store.run_file import RunFile

if TYPE_CHECKING:
    from collector.queries.requests import Engine

# What a CPU tier's loads move at, GB/s: PCIe 4.0 x16's 32 GB/s less protocol overhead (an
# H100 on PCIe 5.0 reaches about twice it). Editable: `kvscope advise --pcie-gb-per-s`.
PCIE_GB_PER_S = 25.0


class RunContext:
    """One run file open for advice, with the KV spec its memory figures assume."""

    def __init__(
        self,
        run: RunFile,
        path: Path,
        spec: KVSpec = MODELS["llama-3.1-8b"],
        gpu: GpuMemory | None = None,
        whatif: Sequence[SweepResult] = (),
        *,
        max_model_len: int | None = None,
        pcie_gb_per_s: float = PCIE_GB_PER_S,
        scheduler_checks: dict[tuple[int, ...], SchedulerCheck] | None = None,
        note: Callable[[str], None] = lambda _: None,
    ) -> None:
        """`whatif`: a what-if sweep's results (`kvscope whatif`), if one is given.
        `scheduler_checks` keeps the run's Scheduler replays by pool sizes
        (collector/advisor/scheduler_check.py): they depend on the run alone, so contexts of
        one run file under other assumptions may share it. `note` is told, in a line, of
        work that takes seconds (a replay through vLLM) before it starts."""
        self.run = run
        self.path = path
        self.spec = spec
        self.gpu = gpu
        self.whatif = whatif
        self.max_model_len = max_model_len  # the engine's --max-model-len, where known
        self.pcie_gb_per_s = pcie_gb_per_s  # host <-> GPU bandwidth a CPU tier's loads take
        self._curves: dict[tuple[int, str], MissRatioCurve] = {}
        self.scheduler_checks = {} if scheduler_checks is None else scheduler_checks
        self.note = note

    @cached_property
    def replay_cache(self) -> ReplayCache:
        """The replays through vLLM kept for this run's content (advisor/replay_cache.py)."""
        return ReplayCache(self.path)

    @cached_property
    def config(self) -> RunRow:
        return run_config(self.run)

    @cached_property
    def options(self) -> RecordedOptions:
        """The replay settings the run recorded (a live capture records fewer than a replay)."""
        return recorded_options(self.config)

    @cached_property
    def summary(self) -> RunSummary:
        return run_summary(self.run)

    @cached_property
    def miss_breakdown(self) -> MissBreakdown | None:
        """The run's miss causes, as `kvscope explain` gives them; None for a run without
        lookups (vLLM's KV events alone)."""
        return read_breakdown(self.run)

    @property
    def block_size(self) -> int:
        return int(self.config["block_size"])

    @property
    def num_blocks(self) -> int:
        return int(self.config["num_blocks"])

    @cached_property
    def num_engines(self) -> int:
        """The engines (engine id x DP rank) the run's records name: 1 for a single engine."""
        return max(num_engines(self.run), 1)

    @property
    def per_engine(self) -> str:
        """Words to put after a pool size: on a fleet, sizes are each engine's."""
        return " per engine" if self.num_engines > 1 else ""

    @property
    def on_each_engine(self) -> str:
        """Where a fleet's setting goes: every engine (each has its own pool); "" for one."""
        return f" (on each of the {self.num_engines} engines)" if self.num_engines > 1 else ""

    @cached_property
    def block_stream(self) -> list[RequestBlocks]:
        """The run's own block hashes, request by request in arrival order (all engines')."""
        return run_block_stream(self.run)[1]

    @cached_property
    def engine_streams(self) -> list[list[RequestBlocks]]:
        """Each engine's own block hashes, request by request in its arrival order."""
        return list(engine_block_streams(self.run)[1].values())

    @cached_property
    def curve(self) -> MissRatioCurve:
        """The one-pass curve of the run's own block hashes (one request at a time); on a
        fleet, each engine's summed at every pool size per engine."""
        if self.num_engines == 1:
            return miss_ratio_curve(self.block_stream, self.block_size)
        return fleet_curve(
            [miss_ratio_curve(stream, self.block_size) for stream in self.engine_streams]
        )

    @cached_property
    def request_engines(self) -> dict[str, Engine]:
        """The engine each request arrived at, by request id."""
        return request_engines(self.run)

    @cached_property
    def has_token_ids(self) -> bool:
        return has_token_ids(self.run)

    @cached_property
    def requests(self) -> list[TraceRequest]:
        """The run's requests with their prompts; NotApplicable without recorded token ids."""
        if not self.has_token_ids:
            raise NotApplicable(
                "needs the prompts' token ids, which this run did not record "
                "(replay with --record-token-ids)"
            )
        return requests_from_run(self.run, self.path)

    def token_curve(
        self, block_size: int, namespace: Namespace = vllm_namespace, label: str = "vllm"
    ) -> MissRatioCurve:
        """The one-pass curve of the recorded prompts at `block_size`, blocks keyed by
        `namespace` (labelled `label` for the cache of curves)."""
        key = (block_size, label)
        if key not in self._curves:
            self._curves[key] = self.prompts_curve(self.requests, block_size, namespace)
        return self._curves[key]

    def prompts_curve(
        self,
        requests: list[TraceRequest],
        block_size: int,
        namespace: Namespace = vllm_namespace,
    ) -> MissRatioCurve:
        """The one-pass curve of `requests` (the run's, maybe changed, in its order) at
        `block_size`; on a fleet, each engine's share on its own, summed."""
        if self.num_engines == 1:
            return miss_ratio_curve(trace_block_stream(requests, block_size, namespace), block_size)
        return fleet_curve(
            [
                miss_ratio_curve(trace_block_stream(share, block_size, namespace), block_size)
                for share in self.engine_shares(requests)
            ]
        )

    def engine_shares(self, requests: list[TraceRequest]) -> list[list[TraceRequest]]:
        """`requests` split by the engine each arrived at, in their order: one list a pool."""
        shares: dict[Engine, list[TraceRequest]] = {}
        for request in requests:
            shares.setdefault(self.request_engines[request.request_id], []).append(request)
        return list(shares.values())

    @property
    def whatif_rows(self) -> list[SweepResult]:
        """The what-if sweep's points that replayed this run's setup: as many pools (engines
        x DP ranks), laid out as the run's, behind the run's router where the run says."""
        router, dp_size = self.options.router, self.options.dp_size
        return [
            row
            for row in self.whatif
            if row.num_pools == self.num_engines
            and row.dp_size == (1 if dp_size is None else dp_size)
            and (router is None or row.router == router)
        ]

    def tokens_at(self, curve: MissRatioCurve, num_blocks: int) -> float:
        """Prefix-hit tokens the curve predicts for this run's requests at `num_blocks`."""
        return curve.hits_at(num_blocks) * curve.block_size

    @property
    def prompt_tokens(self) -> int:
        return int(self.summary["prompt_tokens"])

    def share(self, tokens: float) -> float:
        """Tokens as a share of the run's prompt tokens (points of token hit ratio)."""
        return tokens / self.prompt_tokens if self.prompt_tokens else 0.0
