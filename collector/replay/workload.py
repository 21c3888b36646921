"""`kvscope generate`: a realistic, seeded request trace in kvscope's own format.

Its prompts are English text (`sample_text`) tokenized by a real model's tokenizer, Mistral
7B's, which vLLM's requirement `mistral_common` ships (`token_text.SAMPLE_TOKENIZER`); each
prompt starts with that tokenizer's beginning-of-sequence token, as vLLM's would.

What it holds, so every page and rule has something to show:
- tenants with their own shared system prompts (one tenant salts its cache, per tenant);
- multi-turn chats whose next turn extends the history, the assistant's answer included;
- RAG requests over a pool of documents with skewed (Zipf) popularity;
- one LoRA adapter, used for a share of one tenant's chats;
- one prompt family ("daily-report") with a timestamp near the start, which breaks reuse of
  the long identical instructions that follow it; a cron job sends it in one burst, which
  runs the pool close to empty.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector.replay.sample_text import SampleText
from collector.token_text import SAMPLE_TOKENIZER, TextTokenizer, load_local_tokenizer

# Mistral's tokenizer's beginning-of-sequence token.
BEGIN = 1


class NoSampleTokenizer(RuntimeError):
    """The sample tokenizer is not installed (it comes with vLLM's requirements)."""


@dataclass(frozen=True)
class WorkloadShape:
    """The knobs of the generated workload; the defaults make the committed sample."""

    seed: int = 7
    duration_s: float = 120.0
    num_chats: int = 60
    num_rag_requests: int = 200
    num_reports: int = 60
    num_documents: int = 40
    lora_share: float = 0.5


@dataclass(frozen=True)
class _Tenant:
    name: str
    system_prompt: list[int]
    cache_salt: str | None


class _Builder:
    def __init__(self, shape: WorkloadShape, tokenizer: TextTokenizer) -> None:
        self.shape = shape
        self.random = random.Random(shape.seed)
        self.text = SampleText(self.random, tokenizer.encode)
        self.rows: list[dict[str, Any]] = []

    def arrival_ms(self) -> float:
        return round(self.random.uniform(0, self.shape.duration_s * 1000), 3)

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append({key: value for key, value in row.items() if value is not None})


def generate(shape: WorkloadShape) -> list[dict[str, Any]]:
    """The workload's requests as trace rows, ordered by arrival."""
    tokenizer = load_local_tokenizer(SAMPLE_TOKENIZER)
    if tokenizer is None:
        raise NoSampleTokenizer(
            f"the sample's tokenizer ({SAMPLE_TOKENIZER}) is not installed: it comes with "
            "vLLM (pip install 'kvscope[vllm]'), or pip install mistral_common sentencepiece"
        )
    builder = _Builder(shape, tokenizer)
    tenants = [
        _Tenant(name, [BEGIN, *builder.text.system_prompt(name, low, high)], salt)
        for name, low, high, salt in (
            ("acme", 420, 520, None),
            ("globex", 340, 400, None),
            ("initech", 380, 460, "initech-isolation"),
        )
    ]
    _add_chats(builder, tenants)
    _add_rag(builder, tenants)
    _add_reports(builder, tenants[0])
    rows = sorted(builder.rows, key=lambda row: (row["timestamp"], row["request_id"]))
    return rows


def _add_chats(builder: _Builder, tenants: list[_Tenant]) -> None:
    for chat in range(builder.shape.num_chats):
        tenant = tenants[chat % len(tenants)]
        lora = None
        if tenant.name == "globex" and builder.random.random() < builder.shape.lora_share:
            lora = "globex-sql"
        history = list(tenant.system_prompt)
        timestamp = builder.arrival_ms()
        for turn in range(builder.random.randint(2, 6)):
            history += builder.text.question(tenant.name, 20, 120)
            answer = builder.text.answer(30, 160)
            builder.add(
                {
                    "request_id": f"chat-{chat}-turn-{turn}",
                    "timestamp": timestamp,
                    "token_ids": list(history),
                    "output_length": len(answer),
                    "output_token_ids": answer,
                    "tenant": tenant.name,
                    "lora": lora,
                    "cache_salt": tenant.cache_salt,
                }
            )
            history += answer
            timestamp = round(timestamp + builder.random.uniform(5_000, 30_000), 3)


def _add_rag(builder: _Builder, tenants: list[_Tenant]) -> None:
    documents = [
        builder.text.document(number, 200, 500) for number in range(builder.shape.num_documents)
    ]
    weights = [1 / (rank + 1) ** 1.2 for rank in range(len(documents))]
    for number in range(builder.shape.num_rag_requests):
        tenant = tenants[number % len(tenants)]
        chosen = builder.random.choices(range(len(documents)), weights=weights, k=3)
        prompt = list(tenant.system_prompt)
        for index in sorted(set(chosen)):
            prompt += documents[index]
        prompt += builder.text.question(tenant.name, 15, 40)
        builder.add(
            {
                "request_id": f"rag-{number}",
                "timestamp": builder.arrival_ms(),
                "token_ids": prompt,
                "output_length": builder.random.randint(20, 80),
                "tenant": tenant.name,
                "cache_salt": tenant.cache_salt,
            }
        )


def _add_reports(builder: _Builder, tenant: _Tenant) -> None:
    header = [BEGIN, *builder.text.encode("Daily operations report.")]
    instructions = builder.text.report_instructions()
    burst_start_ms = builder.shape.duration_s * 1000 * 0.4
    for number in range(builder.shape.num_reports):
        timestamp = round(burst_start_ms + builder.random.uniform(0, 3_000), 3)
        # A different short run of tokens every time, right after the header.
        seconds = builder.random.randrange(86_400)
        stamp = builder.text.encode(
            f"Generated at 2026-11-29 {seconds // 3600:02}:{seconds // 60 % 60:02}:"
            f"{seconds % 60:02} UTC."
        )
        prompt = header + stamp + instructions + builder.text.report_figures(50, 100)
        builder.add(
            {
                "request_id": f"report-{number}",
                "timestamp": timestamp,
                "token_ids": prompt,
                "output_length": builder.random.randint(40, 120),
                "tenant": tenant.name,
            }
        )


def write_trace(rows: list[dict[str, Any]], path: Path) -> None:
    """Write rows as JSONL, gzip-compressed when the name ends in .gz; atomically."""
    temporary = path.with_name(f".{path.name}.tmp")
    text = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)
    if path.suffix == ".gz":
        temporary.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        temporary.write_text(text)
    temporary.replace(path)
