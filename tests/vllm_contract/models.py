"""The Hugging Face models vLLM's core tests name, as a Hugging Face cache holding each
model's `config.json` (vLLM's `ModelConfig` reads the architecture from it) and a tokenizer of
its special words (a scheduler's structured-output manager loads one), and for LLaVA its
image processor's settings (vLLM's multimodal registry builds the processor); no weights: the
tests that build these configs never run the model.

With HF_HUB_OFFLINE=1 and HF_HOME pointing at the folder `write_cache` fills, vLLM resolves
the ids the tests use, unchanged, to these files. The figures are the published models'
(their config.json on the Hub); what a field left out means is transformers' default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REVISION = "0" * 40  # the snapshot every id resolves to (refs/main names it)

MODELS: dict[str, dict[str, Any]] = {
    "facebook/opt-125m": {
        "architectures": ["OPTForCausalLM"],
        "model_type": "opt",
        "hidden_size": 768,
        "ffn_dim": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "word_embed_proj_dim": 768,
        "max_position_embeddings": 2048,
        "vocab_size": 50272,
        "do_layer_norm_before": True,
        "bos_token_id": 2,
        "eos_token_id": 2,
        "pad_token_id": 1,
        "torch_dtype": "float16",
    },
    "llava-hf/llava-1.5-7b-hf": {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "image_token_index": 32000,
        "pad_token_id": 32001,
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "text_config": {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-05,
            "vocab_size": 32064,
            "torch_dtype": "float16",
        },
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": 1024,
            "image_size": 336,
            "intermediate_size": 4096,
            "num_attention_heads": 16,
            "num_hidden_layers": 24,
            "patch_size": 14,
            "projection_dim": 768,
            "vocab_size": 32000,
        },
        "torch_dtype": "float16",
    },
    "Qwen/Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "max_window_layers": 28,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "vocab_size": 151936,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen3-Next-80B-A3B-Instruct": {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "num_hidden_layers": 48,
        "full_attention_interval": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "max_position_embeddings": 262144,
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000000,
        "rms_norm_eps": 1e-06,
        "vocab_size": 151936,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
    },
}


# A word-level tokenizer (Hugging Face `tokenizers`' own format) that knows only its specials
# (LLaVA's image and padding tokens at their ids in llava-1.5's config).
VOCABULARY = {"<unk>": 0, "<s>": 1, "</s>": 2, "<image>": 32000, "<pad>": 32001}
TOKENIZER = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [  # matched whole in any text, before it is split into words
        {
            "id": token_id,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for token, token_id in VOCABULARY.items()
    ],
    "normalizer": None,
    "pre_tokenizer": {"type": "Whitespace"},
    "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "vocab": VOCABULARY, "unk_token": "<unk>"},
}
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": "<unk>",
    "bos_token": "<s>",
    "eos_token": "</s>",
}


# llava-hf/llava-1.5-7b-hf's preprocessor_config.json and processor_config.json.
LLAVA_FILES = {
    "preprocessor_config.json": {
        "crop_size": {"height": 336, "width": 336},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_processor_type": "CLIPImageProcessor",
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "processor_class": "LlavaProcessor",
        "resample": 3,
        "rescale_factor": 0.00392156862745098,
        "size": {"shortest_edge": 336},
    },
    "processor_config.json": {
        "image_token": "<image>",
        "num_additional_image_tokens": 1,
        "patch_size": 14,
        "processor_class": "LlavaProcessor",
        "vision_feature_select_strategy": "default",
    },
}
EXTRA_FILES = {"llava-hf/llava-1.5-7b-hf": LLAVA_FILES}


def write_cache(hf_home: Path) -> Path:
    """Fill `hf_home` (a value for HF_HOME) with each model's files; returns it."""
    for model_id, config in MODELS.items():
        repo = hf_home / "hub" / f"models--{model_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION)
        snapshot = repo / "snapshots" / REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        files = {"config.json": config, "tokenizer.json": TOKENIZER}
        files["tokenizer_config.json"] = TOKENIZER_CONFIG
        files.update(EXTRA_FILES.get(model_id, {}))
        for name, content in files.items():
            (snapshot / name).write_text(json.dumps(content, indent=1) + "\n")
    return hf_home
