"""A run's config (`RunConfig`: its source and the cache settings it ran with), and the new
run file it is written into with the schema (`create_run_file`)."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collector.store.leftovers import remove_leftovers
from collector.store.run_opening import StoreError, connect
from collector.store.schema import CREATE_STATEMENTS, DERIVED_STATEMENTS, SCHEMA_VERSION

KVSCOPE_VERSION = "0.1.0"


@dataclass(frozen=True)
class RunConfig:
    """What a run was: its source and the cache settings it ran with."""

    source: str
    block_size: int
    num_blocks: int
    hash_algo: str
    vllm_version: str
    trace: str | None = None
    timing: str | None = None
    max_num_seqs: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC).replace(tzinfo=None))


def create_run_file(path: Path, config: RunConfig) -> None:
    """Create a new run file, schema and config in place before it appears under `path`;
    refuses to overwrite one."""
    if path.exists():
        raise StoreError(f"{path}: already exists; kvscope does not overwrite runs")
    remove_leftovers(path.parent)  # of kvscope commands killed while writing runs there
    temporary = path.with_name(f".{path.name}.creating-{os.getpid()}")
    temporary.unlink(missing_ok=True)
    connection = connect(temporary)
    for statement in CREATE_STATEMENTS:
        connection.execute(statement)
    connection.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
    values = asdict(config)
    values["options"] = json.dumps(config.options, sort_keys=True)
    values["kvscope_version"] = KVSCOPE_VERSION
    names = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    connection.execute(f"INSERT INTO runs ({names}) VALUES ({marks})", list(values.values()))
    for statement in DERIVED_STATEMENTS:
        connection.execute(statement)
    connection.close()
    os.replace(temporary, path)
