"""The words kvscope's pages use, defined once: the app's metric tooltips read them here, and
docs/glossary.md shows each term with the same words (tests/test_glossary.py checks both)."""

from __future__ import annotations

# term -> its definition, as the glossary page shows it.
TERMS = {
    "lookup": "vLLM looking a request's prompt up in the prefix cache, block by block from "
    "the first, when it admits the request (and again when it resumes it after a "
    "preemption). Only full blocks can hit.",
    "hit ratio": "The share of the prompt that the prefix cache served instead of computing "
    "it again, over every lookup in the window.",
    "token hit ratio": "Prompt tokens served from the cache / prompt tokens looked up: vLLM's "
    "own prefix-cache hit ratio. The partial last block never hits, so short prompts lower it.",
    "block hit ratio": "Blocks served from the cache / prompt blocks looked up, the partial "
    "last block counted. Higher than the token hit ratio when prompts end in long partial "
    "blocks; lower when they end on a block boundary.",
    "tokens saved": "Prompt tokens served from the cache instead of computed: the prefill work "
    "the prefix cache saved.",
    "prefix family": "Every cached block that descends from one first block: the requests that "
    "share a system prompt or a document. kvscope names a family by the first words of its "
    "text where token ids were recorded, else by a name given it (`kvscope names RUN --family "
    "KEY=NAME`), else by the tenant and the request that first stored it; its hash is in the "
    "hovers and downloads.",
    "cached-but-free": "A block no running request holds any more, still holding its KV and "
    "still findable by its hash. vLLM counts it as free: it is the first to be evicted when a "
    "request needs a new block, and a hit until then.",
    "free blocks": "Blocks a request could take now: empty ones and cached-but-free ones. The "
    "fewest free blocks in a window is its worst pool pressure; under 10 % free, new requests "
    "evict cached prefixes or wait.",
    "eviction": "vLLM taking a cached-but-free block for a new request: the block's KV is "
    "overwritten and its prefix is no longer cached.",
    "eviction regret": "The share of evicted blocks whose hash was stored again later: KV that "
    "was thrown away and then computed again. High regret means the pool is too small for the "
    "working set, or the wrong blocks are evicted.",
    "preemption": "vLLM pausing a running request when the pool has no block for it: its "
    "blocks are freed, and its prefill is redone (partly from the cache) when it resumes.",
    "miss causes": "Why each missed prompt token missed: cold (first sight), diverged from a "
    "cached prefix, evicted, own blocks lost to preemption, same tokens with another key (salt, "
    "adapter, multimodal input), cached on another engine, cut short by another KV cache "
    "group, cleared by a cache reset, lost when the engine that held it stopped, or the partial "
    "last block. Unexplained tokens are counted with the reason they could not be told.",
    "one-pass curve": "The hit ratio the run's requests would get at every pool size, from one "
    "pass over the run's block references (a miss-ratio curve). Its plateau at an unlimited "
    "pool is the ceiling this traffic can reach with any cache size.",
    "Belady's MIN": "The optimal eviction policy, which evicts the block needed again furthest "
    "in the future. It needs to know the future, so no engine can run it; its hit ratio is the "
    "ceiling for any eviction policy at a given pool size.",
    "LRU": "Least recently used: vLLM's eviction order, which evicts the cached-but-free block "
    "whose last use is oldest.",
    "DP rank": "One data-parallel replica of the model inside a vLLM deployment: each rank has "
    "its own KV cache pool, so a prefix cached on one rank does not hit on another.",
    "engine": "One vLLM engine process with its own KV cache pool; a fleet is several, with a "
    "router sending each request to one.",
    "KV cache group": "A set of layers that share a block table. Hybrid models (sliding window, "
    "chunked local or Mamba layers beside full attention) have several, and a prefix hits only "
    "as far as every group still holds it.",
    "CPU tier": "A second, larger KV store in host memory (offloading): blocks evicted from the "
    "GPU pool can be loaded back from it instead of recomputed.",
    "collision": "Two different prefixes with the same block hash, so a request would be served "
    "another prompt's KV. kvscope checks hits against an independent fingerprint where the "
    "check is on.",
    "dropped events": "Records the hooks could not deliver (a full buffer): every figure of the "
    "run is short by them.",
    "reuse skew": "How concentrated the hits are: the share of hits that go to the most-hit 1 % "
    "or 10 % of cached blocks, and the share of blocks never hit while cached.",
    "advisor gain": "The prompt tokens a suggested change would serve from the cache in this "
    "run, predicted by replaying the run's own requests with the change.",
    "TTFT": "Time to first token: from a request's arrival to its first output token. "
    "Measured on a live capture (from vLLM's own arrival time, as vLLM's TTFT metric counts, to "
    "the step that gave the token, on the engine's side of the socket); modelled on a replay.",
    "queue time": "From a request's arrival at the engine to its first scheduling: the time it "
    "waited for room in a batch, as vLLM's own queue time counts it.",
    "hit share": "How much of a request's prompt the cache held at its lookup (the GPU pool and "
    "an offload tier): none cached, under half, half or more, or all but the tail (all but "
    "its last block, which vLLM computes anyway).",
    "prefill time": "The time to compute a prompt's KV before the first output token: the part "
    "of time to first token that the prefix cache cuts.",
}

# A metric's label (as the pages show it) -> its tooltip, where the page gives none itself.
METRICS = {
    "Hit ratio (tokens)": TERMS["token hit ratio"],
    "Hit ratio (blocks)": TERMS["block hit ratio"],
    "Tokens saved": TERMS["tokens saved"],
    "Requests": "Requests admitted in the window (looked up in the prefix cache at least once).",
    "Prompt tokens": "Prompt tokens looked up in the window, resumed preempted requests counted "
    "again.",
    "Block hits": "Prompt blocks served from the cache, one per block per lookup.",
    "Block hits (tokens)": "Prompt blocks served from the cache, in tokens (blocks x block "
    "size): runs of different block sizes compare in tokens.",
    "Evictions": TERMS["eviction"],
    "Hit": "This request's prompt tokens served from the cache, over all its lookups.",
    "Missed": "This request's prompt tokens computed: the causes below say why.",
    "Blocks cached in this range": "Times a block was stored (cached) in this range; a block "
    "evicted and stored again counts twice.",
    "Hits to the top 1 % of them": TERMS["reuse skew"],
    "Hits to the top 10 %": TERMS["reuse skew"],
    "Never hit while cached": "The share of cached blocks that no lookup hit before they were "
    "evicted or the run ended: stored for nothing.",
    "Fewest free blocks": TERMS["free blocks"],
    "Stretches under 10 % free": "Separate stretches of time with under 10 % of the pool free "
    "(cached-but-free counted as free).",
    "Time under 10 % free": "How long the pool had under 10 % of its blocks free.",
    "Steps under 10 % free": "The share of engine steps that began with under 10 % free.",
    "Suggestions": "The advisor's suggested changes for this run, each checked by a replay.",
    "High severity": "Suggestions whose predicted gain is large: worth doing first.",
    "Largest predicted gain": TERMS["advisor gain"],
    "LRU (vLLM) at this pool": TERMS["LRU"],
    "Ceiling (Belady's MIN)": TERMS["Belady's MIN"],
    "Left to win": "The hit ratio between vLLM's LRU and Belady's MIN at this pool, in "
    "percentage points: what any eviction policy could still win.",
    "Tokens loaded from the tier": "Prompt tokens loaded back from the CPU tier instead of "
    "computed.",
    "Batches received": "Batches of KV events vLLM published and the collector received.",
    "Blocks stored": "Blocks vLLM reported stored (cached) in the GPU pool.",
    "Blocks removed": "Blocks vLLM reported removed from the GPU pool (evicted).",
    "Cache clears": "Times vLLM reported clearing its whole prefix cache (a reset).",
    "Batches lost": "Batches missing from vLLM's numbered stream: their events are unknown.",
    "Hash conflicts": "Stored blocks whose hash was already held with another parent: a sign of "
    "a hash collision, or of events lost.",
    "Published hashes": "The width of the block hashes vLLM publishes: 64-bit hashes can "
    "collide where vLLM's own are wider.",
    "CPU tier: blocks stored": "Blocks vLLM reported stored in the CPU tier.",
    "CPU tier: blocks removed": "Blocks vLLM reported removed from the CPU tier.",
    "CPU tier: blocks held at the end": "Blocks the CPU tier held when the run ended.",
}


def metric_help(label: str) -> str | None:
    """The tooltip of a metric labelled `label` (None: the glossary has none)."""
    return METRICS.get(label)
