"""The README is a user's guide; the reference lives in docs/. Links resolve, the docs stay inside the repository.

The blocks the README and docs/ carry are run by their own tests: tests/test_readme_use_the_answer.py (the
README's "Use the answer"), tests/test_sampler.py (docs/search.md's sampler example), tests/test_layout.py
(docs/layout.md's map).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_anchor(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_readme_stays_short_and_in_the_users_order() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 260, "README.md is a user's guide of about 250 lines; reference goes to docs/"
    heads = re.findall(r"^#{2,3} (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M)
    order = ["What it does", "Install", "Two commands", "`autotune run`", "`autotune probe`", "Use the answer",
             "The Python API", "Use autotune in your pipeline", "`autotune plan`", "`autotune check`"]
    where = [next(i for i, h in enumerate(heads) if h.startswith(o)) for o in order]
    assert where == sorted(where), f"README sections out of order: {heads}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_to_a_file_and_heading_of_the_repository(page: Path) -> None:
    bad = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_relative_to(ROOT) or not dest.exists():
            bad.append(f"{target}: no such file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in LINK.findall(README.read_text("utf-8"))}
    assert {p.resolve() for p in DOCS} - linked == set()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs_are_written_for_readers_of_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for pattern, why in [(r"\bissues? \d+", "issue numbers"), (r"\.\./shared|STACK-NOTES|the notes'", "notes outside the repository"),
                         (r"\b20\d\d-\d\d-\d\d\b", "dated lab-notebook entries"), (r"farm-", "internal tools")]:
        found = re.findall(pattern, text)
        assert not found, f"{page.relative_to(ROOT)} mentions {why}: {found[:3]}"


def test_the_readmes_test_command_is_what_ci_runs() -> None:
    assert re.search(r"^make test\b", README.read_text(encoding="utf-8"), re.M), "README must state `make test`"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^make test$", ci, re.M), ".ci/run must call the README's test command"
    assert re.search(r"^test: ", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
