"""The KV cache layout a replay builds: the KV cache groups vLLM's hybrid allocator makes for a
model, named by a preset or spelled out.

vLLM puts layers of one attention kind into groups of equal size, so a model with five
sliding-window layers to each full-attention layer gets six groups: one full, five sliding.
Every group holds blocks of every request, all from one pool; a prefix hit is the longest
prefix every group can serve. A layout here is that list of groups, each a kind and the
tokens it reads back: `full`, `sliding_window:TOKENS` (the window), `chunked_local:TOKENS`
(the chunk), separated by commas.
"""

from __future__ import annotations

KINDS = ("full", "sliding_window", "chunked_local")

# Layouts shaped like these models' (the proportions of their layers, and their windows).
PRESETS = {
    "full": "full",
    # gpt-oss: sliding-window (128 tokens) and full-attention layers alternate.
    "gpt-oss": "full,sliding_window:128",
    # Gemma 3: five local layers (a 1024-token window) to each global one.
    "gemma3": ",".join(["full"] + ["sliding_window:1024"] * 5),
    # Llama 4: three chunked-local layers (8192-token chunks) to each global one.
    "llama4": ",".join(["full"] + ["chunked_local:8192"] * 3),
}

KvLayout = tuple[tuple[str, int], ...]  # per group: its kind, and its window or chunk (0)


def parse_layout(text: str) -> KvLayout:
    """The groups a preset name or a spelled-out layout describes; ValueError if neither."""
    spelled = PRESETS.get(text, text)
    groups = []
    for item in spelled.split(","):
        kind, _, tokens = item.strip().partition(":")
        if kind not in KINDS:
            raise ValueError(
                f"KV cache layout {text!r}: unknown group {item.strip()!r}; use a preset "
                f"({', '.join(PRESETS)}) or groups of {', '.join(KINDS)} separated by commas"
            )
        if kind == "full":
            if tokens:
                raise ValueError(f"KV cache layout {text!r}: a full-attention group has no window")
            groups.append((kind, 0))
            continue
        if not tokens.isdigit() or int(tokens) < 1:
            raise ValueError(
                f"KV cache layout {text!r}: {kind} needs its tokens, a positive whole number "
                f"({kind}:TOKENS), got {item.strip()!r}"
            )
        groups.append((kind, int(tokens)))
    return tuple(groups)


def check_fits(layout: KvLayout, block_size: int) -> None:
    """ValueError unless vLLM can build the layout at this block size: local chunks are
    whole blocks."""
    for kind, tokens in layout:
        if kind == "chunked_local" and tokens % block_size:
            raise ValueError(
                f"a chunked-local group's chunk ({tokens} tokens) must be a whole number of "
                f"blocks ({block_size} tokens each)"
            )
