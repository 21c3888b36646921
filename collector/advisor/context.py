"""Everything the rules read about one run, each piece computed once and only when asked."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.advisor.suggestion import NotApplicable
from collector.model.block_stream import (
    Namespace,
    RequestBlocks,
    trace_block_stream,
    vllm_namespace,
)
from collector.model.kv_memory import MODELS, GpuMemory, KVSpec
from collector.model.mrc import MissRatioCurve, miss_ratio_curve
from collector.queries.config import RunRow, run_config
from collector.queries.summary import RunSummary, run_summary
from collector.replay.traces import TraceRequest
from collector.store.run_file import RunFile

if TYPE_CHECKING:
    from collector.advisor.scheduler_check import SchedulerCheck

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
        whatif: dict[str, Any] | None = None,
        *,
        max_model_len: int | None = None,
        pcie_gb_per_s: float = PCIE_GB_PER_S,
    ) -> None:
        self.run = run
        self.path = path
        self.spec = spec
        self.gpu = gpu
        self.whatif = whatif
        self.max_model_len = max_model_len  # the engine's --max-model-len, where known
        self.pcie_gb_per_s = pcie_gb_per_s  # host <-> GPU bandwidth a CPU tier's loads take
        self._curves: dict[tuple[int, Any], MissRatioCurve] = {}
        self._scheduler_checks: dict[tuple[int, ...], SchedulerCheck] = {}

    @cached_property
    def config(self) -> RunRow:
        return run_config(self.run)

    @cached_property
    def summary(self) -> RunSummary:
        return run_summary(self.run)

    @property
    def block_size(self) -> int:
        return int(self.config["block_size"])

    @property
    def num_blocks(self) -> int:
        return int(self.config["num_blocks"])

    @cached_property
    def block_stream(self) -> list[RequestBlocks]:
        """The run's own block hashes, request by request in arrival order."""
        from collector.queries.requests import run_block_stream

        return run_block_stream(self.run)[1]

    @cached_property
    def curve(self) -> MissRatioCurve:
        """The one-pass curve of the run's own block hashes (one request at a time)."""
        return miss_ratio_curve(self.block_stream, self.block_size)

    @cached_property
    def has_token_ids(self) -> bool:
        from collector.queries.requests import has_token_ids

        return has_token_ids(self.run)

    @cached_property
    def requests(self) -> list[TraceRequest]:
        """The run's requests with their prompts; NotApplicable without recorded token ids."""
        from collector.queries.requests import requests_from_run

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
            stream = trace_block_stream(self.requests, block_size, namespace)
            self._curves[key] = miss_ratio_curve(stream, block_size)
        return self._curves[key]

    def scheduler_check(self, pool_sizes: tuple[int, ...]) -> SchedulerCheck:
        """The run's requests replayed through vLLM's Scheduler at `pool_sizes` (or why not),
        replayed once for every rule that asks."""
        if pool_sizes not in self._scheduler_checks:
            from collector.advisor.scheduler_check import check_pools

            self._scheduler_checks[pool_sizes] = check_pools(self, pool_sizes)
        return self._scheduler_checks[pool_sizes]

    def tokens_at(self, curve: MissRatioCurve, num_blocks: int) -> float:
        """Prefix-hit tokens the curve predicts for this run's requests at `num_blocks`."""
        return curve.hits_at(num_blocks) * curve.block_size

    @property
    def prompt_tokens(self) -> int:
        return int(self.summary["prompt_tokens"])

    def share(self, tokens: float) -> float:
        """Tokens as a share of the run's prompt tokens (points of token hit ratio)."""
        return tokens / self.prompt_tokens if self.prompt_tokens else 0.0
