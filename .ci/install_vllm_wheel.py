#!/usr/bin/env python3
"""Install a vLLM release whose wheel pins a requirement the package index does not have.

vLLM 0.34.0's wheel pins `flashinfer-python==0.7.3`, which the index does not hold, so
`pip install vllm==0.34.0` fails. This installs the wheel's other requirements (markers and
all, as pip would), then the wheel itself with `--no-deps`. kvscope never calls FlashInfer:
the block manager, the scheduler and the KV events run without it.

    python .ci/install_vllm_wheel.py 0.34.0 [--skip flashinfer-python] [--pip PIP_ARGS...]

Run it with the environment's own python (it installs into `sys.executable`'s environment).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SKIP = ("flashinfer-python",)


def requirement_name(line: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
    return (match.group(0) if match else line).lower().replace("_", "-")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="the vLLM version, e.g. 0.34.0")
    parser.add_argument(
        "--skip", action="append", default=list(SKIP), help="a requirement to leave out"
    )
    args = parser.parse_args()
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [*pip, "download", "--quiet", "--no-deps", f"vllm=={args.version}", "-d", folder],
            check=True,
        )
        (wheel,) = Path(folder).glob("vllm-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
            lines = archive.read(metadata).decode().splitlines()
        skip = {name.lower() for name in args.skip}
        requirements = [
            line.removeprefix("Requires-Dist:").strip()
            for line in lines
            if line.startswith("Requires-Dist:")
        ]
        kept = [line for line in requirements if requirement_name(line) not in skip]
        left_out = sorted({requirement_name(line) for line in requirements} & skip)
        requirements_file = Path(folder) / "requirements.txt"
        requirements_file.write_text("\n".join(kept) + "\n")
        subprocess.run([*pip, "install", "--quiet", "-r", str(requirements_file)], check=True)
        subprocess.run([*pip, "install", "--quiet", "--no-deps", str(wheel)], check=True)
    print(f"vLLM {args.version} installed without: {', '.join(left_out) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
