#!/usr/bin/env python3
"""Fetch vLLM's own core tests of one release from its source archive on the package index.

    python .ci/fetch_vllm_tests.py 0.34.0 .vllm-tests/0.34.0

`pip download --no-binary vllm` prepares the archive's metadata before it saves it, and to do
that it installs vLLM's build requirements (CUDA torch, several GB) into a throwaway
environment: a CI run once stopped there on a full disk. This reads the index's page for vLLM
instead (PEP 503, the index pip is configured with, else PyPI), downloads the archive alone,
checks its sha256 against the index's, and unpacks only the files the contract tests use.
Nothing is installed and nothing is built.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import html.parser
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

PYPI = "https://pypi.org/simple/"
MEMBERS = (
    "*/tests/v1/core/*",
    "*/tests/v1/kv_connector/unit/utils.py",
    "*/tests/utils.py",
    "*/LICENSE",
)


class Links(html.parser.HTMLParser):
    """The href of every anchor on a PEP 503 project page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def index_urls() -> list[str]:
    """pip's configured index (environment, then config files), its extra ones, then PyPI."""
    urls = [
        url
        for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")
        for url in os.environ.get(name, "").split()
    ]
    for key in ("global.index-url", "global.extra-index-url"):
        found = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", key],
            capture_output=True,
            text=True,
            check=False,
        )
        if found.returncode == 0:
            urls.extend(found.stdout.split())
    return [*urls, PYPI]


def archive_link(version: str) -> tuple[str, str]:
    """The URL of vllm-VERSION.tar.gz and its sha256, from the first index that lists it."""
    wanted = f"vllm-{version}.tar.gz"
    for index in index_urls():
        page = urllib.parse.urljoin(index.rstrip("/") + "/", "vllm/")
        try:
            with urllib.request.urlopen(page, timeout=60) as response:
                text = response.read().decode()
        except OSError:
            continue
        links = Links()
        links.feed(text)
        for href in links.hrefs:
            url, _, fragment = href.partition("#")
            if url.rsplit("/", 1)[-1] == wanted and fragment.startswith("sha256="):
                return urllib.parse.urljoin(page, url), fragment.removeprefix("sha256=")
    raise SystemExit(f"fetch_vllm_tests: no index lists {wanted} with a sha256")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="the vLLM release, e.g. 0.34.0")
    parser.add_argument("folder", type=Path, help="where the archive's files go")
    args = parser.parse_args()
    url, sha256 = archive_link(args.version)
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "vllm.tar.gz"
        digest = hashlib.sha256()
        with urllib.request.urlopen(url, timeout=300) as response, archive.open("wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != sha256:
            raise SystemExit(
                f"fetch_vllm_tests: {url}: sha256 {digest.hexdigest()}, index says {sha256}"
            )
        unpacked = Path(scratch) / "unpacked"
        with tarfile.open(archive) as tar:
            members = [
                member
                for member in tar.getmembers()
                if member.isfile() and any(fnmatch.fnmatch(member.name, p) for p in MEMBERS)
            ]
            tar.extractall(unpacked, members=members, filter="data")
        (top,) = unpacked.iterdir()
        # Whole or not at all: a folder cut short is not mistaken for a fetched one.
        shutil.rmtree(args.folder, ignore_errors=True)
        args.folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(top, args.folder)
    print(f"fetch_vllm_tests: {len(members)} files of vLLM {args.version} in {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
