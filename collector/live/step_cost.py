"""The replay's step cost measured on a running vLLM server (`kvscope calibrate`).

A replay's clock (`--timing scheduler` and `timestamps`) says a step lasts `step_ms`, plus
`prefill_us_per_token` for each prompt token it computes and `decode_us_per_token` for each
token it decodes. Where requests overlap, those figures decide how they meet in the pool, so
they are measured on the engine itself, through its OpenAI API:

- **decode**: `k` requests of a short prompt sent at once, once with 1 output token and once
  with `1 + n`: the difference is `n` decode steps of `k` tokens each, so a step of `k`
  decodes takes `(difference) / n`; a straight line through those times for several `k`
  gives `step_ms` (its intercept) and `decode_us_per_token` (its slope);
- **prefill**: one request of `L` random prompt tokens and 1 output token, for several `L`:
  its latency less the fixed cost of the steps it takes (`ceil(L / budget)` with the
  server's `--max-num-batched-tokens`) is a straight line in `L` whose slope is
  `prefill_us_per_token` (its intercept, the HTTP round trip, is not a step's).

Prompts are random token ids from TOKEN_RANGE (ids every common vocabulary holds), so no
probe hits the prefix cache; their blocks do take cache space and push cached blocks toward
eviction, so calibrate an idle server. Each latency is the median of `repeats` tries.
"""

from __future__ import annotations

import json
import random
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from collector.model.step_model import StepModel

TOKEN_RANGE = (100, 30_000)
TIMEOUT_S = 300
MAX_ANSWER_BYTES = 1 << 20  # a completion of a few tokens is far smaller


class ServerError(ValueError):
    """The server did not answer as a vLLM OpenAI server does."""


@dataclass(frozen=True)
class Measurements:
    """Median latencies (s): one request per prompt length, and a decode step by batch."""

    prefill_s: dict[int, float]  # prompt tokens -> latency of 1 output token
    decode_step_s: dict[int, float]  # requests decoding at once -> one step


class CompletionsClient:
    """`/v1/completions` with token-id prompts, greedy, EOS ignored."""

    def __init__(self, url: str, model: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        answer = self._call("/v1/models", None)
        try:
            return str(answer["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise ServerError(f"{self.url}/v1/models lists no model") from None

    def complete(self, prompt: list[int], max_tokens: int) -> None:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        answer = self._call("/v1/completions", body)
        if answer.get("usage", {}).get("completion_tokens") != max_tokens:
            raise ServerError(f"{self.url} did not return {max_tokens} tokens: {answer}")

    def _call(self, path: str, body: dict[str, object] | None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path, data, {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                answer = json.loads(response.read(MAX_ANSWER_BYTES))
        except urllib.error.HTTPError as error:
            detail = error.read()[:300].decode(errors="replace")
            raise ServerError(f"{self.url}{path}: HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as error:
            raise ServerError(f"{self.url}{path}: {error}") from None
        except json.JSONDecodeError:
            raise ServerError(f"{self.url}{path}: the answer is not JSON") from None
        if not isinstance(answer, dict):
            raise ServerError(f"{self.url}{path}: the answer is not a JSON object")
        return answer


def measure(
    client: CompletionsClient,
    prompt_lengths: Sequence[int],
    batch_sizes: Sequence[int],
    *,
    decode_tokens: int = 32,
    repeats: int = 3,
    seed: int = 0,
) -> Measurements:
    """Probe the server: prefill latencies by prompt length, decode steps by batch size."""
    rng = random.Random(seed)

    def timed(batch: int, prompt_tokens: int, max_tokens: int) -> float:
        prompts = [
            [rng.randrange(*TOKEN_RANGE) for _ in range(prompt_tokens)] for _ in range(batch)
        ]
        start = time.monotonic()
        with ThreadPoolExecutor(batch) as pool:
            list(pool.map(lambda prompt: client.complete(prompt, max_tokens), prompts))
        return time.monotonic() - start

    def median(batch: int, prompt_tokens: int, max_tokens: int) -> float:
        return statistics.median(timed(batch, prompt_tokens, max_tokens) for _ in range(repeats))

    timed(1, 16, 2)  # the first request pays for warm-ups that no step does
    prefill = {length: median(1, length, 1) for length in prompt_lengths}
    decode = {
        batch: (median(batch, 16, 1 + decode_tokens) - median(batch, 16, 1)) / decode_tokens
        for batch in batch_sizes
    }
    return Measurements(prefill, decode)


def fit_step_model(measured: Measurements, max_num_batched_tokens: int) -> StepModel:
    """The step model the measurements give (figures below 0 from noise become 0)."""
    step_s, decode_s = _line(measured.decode_step_s)
    step_s = max(step_s, 0.0)
    fixed = {
        length: latency - -(-length // max_num_batched_tokens) * step_s
        for length, latency in measured.prefill_s.items()
    }
    _, prefill_s = _line(fixed)
    return StepModel(
        step_ms=round(step_s * 1e3, 3),
        prefill_us_per_token=round(max(prefill_s, 0.0) * 1e6, 2),
        decode_us_per_token=round(max(decode_s, 0.0) * 1e6, 2),
    )


def _line(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares intercept and slope of y against x."""
    if len(points) < 2:
        raise ValueError("a fit needs at least two prompt lengths and two batch sizes")
    xs, ys = list(points), list(points.values())
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope
