"""The README is the entry point and docs/ the reference: every relative link between the pages
lands on a file that exists and, with a `#fragment`, on a heading of it; the README lists every
page of docs/ and stays short enough to read first."""

from __future__ import annotations

import re
from pathlib import Path

from loadwatch.daemon.tools.install_files import ops_files

from .common import ROOT

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("*/README.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_slug_is_githubs() -> None:
    assert slug("vLLM's log in watch mode") == "vllms-log-in-watch-mode"
    assert slug("`loadwatch status`, the live view") == "loadwatch-status-the-live-view"
    assert slug("[log]") == "log"


def test_every_relative_link_lands_on_a_file_and_heading() -> None:
    broken = []
    for page in PAGES:
        for target in relative_links(page):
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert not broken, "\n".join(broken)


def test_the_readme_lists_every_page_of_docs() -> None:
    listed = {t.partition("#")[0] for t in relative_links(README)}
    missing = [
        p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"docs/{p.name}" not in listed
    ]
    assert not missing, f"README.md links no docs/{missing}"


def test_every_page_of_docs_is_packaged() -> None:
    """`loadwatch install-files` writes docs/ from the package: a page left out of it would be
    missing on a host installed from a wheel."""
    packaged = ops_files()
    missing = [
        p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"docs/{p.name}" not in packaged
    ]
    assert not missing, f"not in the package: {missing} (make venv; pyproject package-data)"


def test_the_readme_is_an_entry_point() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.split()) <= 1800
    for heading in ("## Quick start", "## Troubleshooting", "## Documentation", "## Development"):
        assert f"\n{heading}\n" in text, heading
