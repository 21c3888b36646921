"""Advice as Markdown (for people) or a JSON document (for scripts and CI)."""

from __future__ import annotations

from typing import Any

from collector.advisor.context import RunContext
from collector.advisor.ranking import Advice
from collector.queries.config import describe_source
from collector.safe_text import code, markdown_text


def run_line(context: RunContext) -> str:
    """One line of Markdown saying which run the advice is about (what the run names, its
    source, hash and vLLM version, escaped)."""
    config, summary = context.config, context.summary
    return (
        f"{markdown_text(describe_source(config), limit=None)}: block size "
        f"{context.block_size}, {_pools(context)}, {code(config['hash_algo'])}, "
        f"vLLM {code(config['vllm_version'])}; {summary['requests']:,} requests, token hit "
        f"ratio {summary['token_hit_ratio']:.1%}"
    )


def _pools(context: RunContext) -> str:
    if context.num_engines == 1:
        return f"{context.num_blocks:,} blocks"
    return f"{context.num_engines} engines of {context.num_blocks:,} blocks each"


def to_markdown(document: dict[str, Any], context: RunContext) -> str:
    """Ranked suggestions, each with evidence, effect and action; then every rule's check
    (from the advice's document, `to_document`'s, worked out now or kept)."""
    lines = [
        f"# kvscope advice: {code(context.path.name)}",
        "",
        run_line(context),
        "",
        f"KV memory figures assume {context.spec.describe()}.",
        "",
    ]
    if not document["suggestions"]:
        lines += ["No suggestions: every rule that could judge this run found nothing to fix.", ""]
    for entry in document["suggestions"]:
        lines += [
            f"## {entry['rank']}. {entry['title']}",
            "",
            f"*{entry['severity']}* · rule `{entry['rule']}`",
            "",
            "Evidence:",
            *[f"- {line}" for line in entry["evidence"]],
            "",
            f"Predicted effect: {entry['effect']}",
            "",
            f"Do this: {entry['action']}",
            "",
        ]
    lines += ["## Checks", "", "| rule | result | detail |", "| --- | --- | --- |"]
    lines += [
        f"| {check['rule']} | {check['status']} | {check['detail'].replace('|', '/')} |"
        for check in document["checks"]
    ]
    return "\n".join(lines) + "\n"


def to_document(advice: Advice, context: RunContext) -> dict[str, Any]:
    """The advice as one JSON-ready document."""
    return {
        "run": str(context.path),
        "run_config": {
            "block_size": context.block_size,
            "num_blocks": context.num_blocks,
            "num_engines": context.num_engines,
            "hash_algo": context.config["hash_algo"],
            "timing": context.config["timing"],
            "max_num_seqs": context.config["max_num_seqs"],
        },
        "token_hit_ratio": context.summary["token_hit_ratio"],
        "kv_spec": context.spec.to_dict(),
        "suggestions": [
            {"rank": rank, **suggestion.to_dict()}
            for rank, suggestion in enumerate(advice.suggestions, start=1)
        ],
        "checks": [vars(check) for check in advice.checks],
    }
