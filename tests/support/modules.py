"""Which top-level modules a statement loads, run in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys


def loaded_modules(statement: str) -> set[str]:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return {name.split(".")[0] for name in json.loads(result.stdout)}
