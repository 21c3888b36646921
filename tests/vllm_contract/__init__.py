"""Contract tests from vLLM itself (tests/test_vllm_contract.py): the plugins and model files
its pytest runs of vLLM's own tests load."""
