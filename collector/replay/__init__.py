"""Traces and the replays of them through vLLM's real KV cache manager, and what-if sweeps."""
