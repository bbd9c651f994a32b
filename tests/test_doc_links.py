"""Every relative link in README.md and docs/*.md resolves: to an existing file, and a
``#anchor`` to a heading of the file it names (GitHub's heading slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """``text`` without fenced code blocks (a ``# comment`` there is no heading, a ``[x](y)`` no link)."""
    return _FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for m in _HEADING.finditer(_prose(path.read_text(encoding="utf-8"))):
        s = slug(m[1])
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def relative_links(path: Path) -> list[str]:
    """The relative link targets of a Markdown file (web and mail links left out)."""
    text = _INLINE_CODE.sub("", _prose(path.read_text(encoding="utf-8")))
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_slug_is_githubs():
    assert slug("What each condition's text is worth: the reader") == "what-each-conditions-text-is-worth-the-reader"
    assert slug("A C1 / C2 / C2_silent / C2_placebo comparison from scratch") == \
        "a-c1--c2--c2_silent--c2_placebo-comparison-from-scratch"
    assert slug("Conditions and the episodic memory (seed 001)") == "conditions-and-the-episodic-memory-seed-001"
    assert slug("`dvc.yaml` deps") == "dvcyaml-deps"


def broken_links(doc: Path) -> list[str]:
    """Each relative link of ``doc`` that names no file, or a heading its file lacks."""
    broken = []
    for target in relative_links(doc):
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    return broken


def test_a_missing_file_or_heading_is_reported(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A section\n", encoding="utf-8")
    doc = tmp_path / "page.md"
    doc.write_text("# Page\n\n[ok](other.md) [ok](other.md#a-section) [ok](#page) [web](https://x.org/y)\n"
                   "[gone](missing.md) [no heading](other.md#nowhere)\n```bash\n# not a heading\n[x](in-code.md)\n```\n",
                   encoding="utf-8")
    assert broken_links(doc) == ["missing.md: no such file", "other.md#nowhere: no heading #nowhere in other.md"]


def test_the_docs_have_links_to_check():
    assert len(relative_links(ROOT / "README.md")) >= 10


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(doc):
    broken = broken_links(doc)
    assert not broken, f"{doc.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)
