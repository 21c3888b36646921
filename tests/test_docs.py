"""The README and the manual in docs/ say only what exists: every relative link leads to a
file (and heading) of the repository, every repository path they name exists, every app page
they name is one of the app's pages, and the README stays a front page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.repo import REPO
from visualizer.pages import PAGES

README = REPO / "README.md"
MANUAL = sorted((REPO / "docs").rglob("*.md"))
DOCUMENTS = [README, *MANUAL]
MAX_README_LINES = 210
TEST_COMMAND = ".venv/bin/python -m pytest"  # what .ci/run runs, and the README gives

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PATH_TOKEN = re.compile(r"[\w.*/-]+")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)
PAGE_MENTION = re.compile(r"\b[Tt]he ((?:vLLM|[A-Z])[\w&]*(?: [\w&]+){0,3}?) pages?\b")
# A path in the docs is a repository path when its first part is one of these folders.
ROOTS = {path.name for path in REPO.iterdir() if path.is_dir() and not path.name.startswith(".")}
ROOTS.add(".ci")


def name(path: Path) -> str:
    return str(path.relative_to(REPO))


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return FENCE.sub("", text)


def code(text: str) -> list[str]:
    """The fenced code blocks and the inline code spans."""
    return FENCE.findall(text) + CODE_SPAN.findall(prose(text))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    kept = re.sub(r"[^\w\- ]", "", heading.lower())
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(heading) for heading in HEADING.findall(prose(path.read_text()))}


def link_problems(path: Path) -> list[str]:
    problems = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.is_relative_to(REPO) or not linked.exists():
            problems.append(f"{name(path)}: link to {target}: no such file in the repository")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{name(path)}: link to {target}: no such heading")
    return problems


def repository_paths(text: str) -> set[str]:
    """Every path under a repository folder that the code in `text` names."""
    paths = set()
    for snippet in code(text):
        for found in PATH_TOKEN.findall(snippet):
            token = found.rstrip(".")  # a sentence's full stop
            first = token.removeprefix("./").split("/")[0]
            if "/" in token and (first in ROOTS or first == ".."):
                paths.add(token)
    return paths


def path_problems(path: Path) -> list[str]:
    problems = []
    for mentioned in sorted(repository_paths(path.read_text())):
        if mentioned.startswith(".."):
            problems.append(f"{name(path)}: {mentioned}: outside the repository")
        elif "*" in mentioned:
            if not list(REPO.glob(mentioned)):
                problems.append(f"{name(path)}: {mentioned}: matches no file")
        elif not (REPO / mentioned).exists():
            problems.append(f"{name(path)}: {mentioned}: no such file or folder")
    return problems


@pytest.mark.parametrize("path", DOCUMENTS, ids=name)
def test_every_relative_link_leads_to_a_file_and_heading_of_the_repository(path: Path) -> None:
    assert link_problems(path) == []


@pytest.mark.parametrize("path", DOCUMENTS, ids=name)
def test_every_repository_path_named_exists(path: Path) -> None:
    assert path_problems(path) == []


@pytest.mark.parametrize("path", DOCUMENTS, ids=name)
def test_every_page_named_is_a_page_of_the_app(path: Path) -> None:
    titles = {page.title for page in PAGES}
    named = set(PAGE_MENTION.findall(prose(path.read_text())))
    assert named - titles == set(), f"pages the app does not have: {named - titles}"


def test_the_manual_describes_every_page_of_the_app_in_its_order() -> None:
    text = prose((REPO / "docs" / "app.md").read_text())
    table = text.split("## The pages", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \|", table, re.MULTILINE)
    assert rows[2:] == [page.title for page in PAGES]  # after the header and its rule


def test_the_readme_is_a_front_page_linking_every_page_of_the_manual() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    linked = {(REPO / target.partition("#")[0]).resolve() for target in LINK.findall(text)}
    assert [name(page) for page in MANUAL if page not in linked] == []


def test_the_readme_gives_the_test_command_ci_runs_and_the_apps_own_set_up() -> None:
    text = README.read_text()
    assert f"{TEST_COMMAND}\n" in (REPO / ".ci" / "run").read_text().replace(" || ", "\n")
    assert f".ci/setup --browser && {TEST_COMMAND}\n" in text
    assert ".ci/setup --app && .venv-app/bin/kvscope app\n" in text
