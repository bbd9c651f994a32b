"""The docs name only what exists. In README.md and docs/*.md: every relative link resolves
(to an existing file, and a ``#anchor`` to a heading of the file it names, GitHub's heading
slugs); every config key or override written in backticks, or passed as ``-S`` / to
``pipeline.core.config compose`` in a code block, composes (placeholders such as ``seed=N``:
the key exists; the docs' examples of a refused value are listed here and must be refused);
every source path in backticks exists and every ``pipeline.<module>.<name>`` resolves."""

from __future__ import annotations

import functools
import importlib
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.core.config import EXPERIMENT, MODEL, ConfigError, compose_text, validate

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


# -- config keys ------------------------------------------------------------------------------

# The docs' examples of what compose refuses, with what its message must name.
REFUSED = {"sampling.temperature=abc": "sampling.temperature", "condition=[C1,C9]": "condition/C9",
           "agent.on_backend_error=retry": "expected one of [record, fail]"}

_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_OVERRIDE = re.compile(r"[+~]?([A-Za-z_]\w*(?:\.\w+)*)=(.*)")
# an override (its value a {dict} or [list] with spaces, or up to a space or quote), or a dotted key
_MENTION = re.compile(r"(?<![\w./-])(?:[+~]?[A-Za-z_]\w*(?:\.\w+)*=(?:\{[^}]*\}|\[[^\]]*\]|[^\s'\";:]*[^\s'\";:,.])"
                      r"|[A-Za-z_]\w*(?:\.\w+)+(?![\w/]))")
_FILE_NAME = re.compile(r"\.(py|json|yaml|yml|parquet|md|safetensors|txt|csv|html|lock|png|z8|gguf)$")
_PLACEHOLDER = re.compile(r"<|\.\.\.|^[A-Z]$|^range\(")


@functools.cache
def _defaults() -> tuple:
    """Each pipeline's composed defaults (plain containers)."""
    return tuple(OmegaConf.to_container(OmegaConf.create(compose_text(ROOT, pipeline=p))) for p in (EXPERIMENT, MODEL))


def _top_keys() -> set[str]:
    return {k for d in _defaults() for k in d}


def config_mentions(text: str) -> list[str]:
    """The config keys (``a.b``) and overrides (``a.b=v``, ``group=option``) a Markdown text
    writes: in inline code (a span holding a call, ``f(x=1)``, is code, not config), and
    in code blocks as ``-S`` arguments and ``pipeline.core.config compose`` arguments. Only
    those whose first part is a top-level key of either pipeline's config; file names left out."""
    spans = [s for s in _CODE_SPAN.findall(_prose(text)) if "(" not in s]
    for block in _FENCE.finditer(text):
        for line in block[0].splitlines():
            line = line.split("  #")[0]
            spans += [a or b for a, b in re.findall(r"-S\s+'([^']+)'|-S\s+(\S+)", line)]
            if re.search(r"pipeline\.core\.config compose\b", line):
                spans.append(line.split("compose", 1)[1])
    out = []
    top = _top_keys()
    for span in spans:
        for tok in _MENTION.findall(span):
            m = _OVERRIDE.fullmatch(tok)
            key = m[1] if m else tok
            if key.split(".")[0] in top and not _FILE_NAME.search(key) and tok not in out:
                out.append(tok)
    return out


def _has_key(key: str) -> bool:
    for d in _defaults():
        node = d
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            return True
    return (ROOT / "conf" / key).is_dir()  # a config group (`experiment=<name>`)


@functools.cache  # the docs name the same overrides many times (131 composes, 75 distinct), each a Hydra compose
def _compose_error(override: str) -> str | None:
    """Why ``override`` does not compose in either pipeline (None: it composes in one)."""
    errors = []
    for pipeline in (EXPERIMENT, MODEL):
        try:
            validate(OmegaConf.create(compose_text(ROOT, [override], pipeline=pipeline)), schema=pipeline.schema)
            return None
        except (ConfigError, ValueError) as exc:
            errors.append(f"{pipeline.name}: {exc}")
    return " / ".join(errors)


def _choices(value: str) -> list[str]:
    """A sweep's values (``a,b``: each; a list ``[a,b]`` is one value)."""
    return value.split(",") if "," in value and not value.startswith("[") else [value]


def unknown_config(text: str) -> list[str]:
    """Each config mention of ``text`` that does not compose, with why; each of
    :data:`REFUSED` that composes, or is refused for another reason."""
    bad = []
    for tok in config_mentions(text):
        m = _OVERRIDE.fullmatch(tok)
        if m is None or _PLACEHOLDER.search(m[2]):
            key = m[1] if m else tok
            if not _has_key(key):
                bad.append(f"{tok}: no key {key} in either pipeline's config, and no group conf/{key}/")
            continue
        if tok in REFUSED:
            err = _compose_error(tok)
            if err is None or REFUSED[tok] not in err:
                bad.append(f"{tok}: the docs say it is refused naming {REFUSED[tok]!r}; compose says {err!r}")
            continue
        for value in _choices(m[2]):
            err = _compose_error(f"{tok.split('=')[0]}={value}")
            if err is not None:
                bad.append(f"{tok}: {err[:300]}")
    return bad


def test_a_wrong_key_or_value_is_reported():
    text = ("Set `memory.topk=3` or `memory.no_such_key=3`; `agent=rag`, `agent=nowhere`, `seed=N`, `env.nope=<n>`,\n"
            "`memory.scene.read_scene_facts`; code: `make_agent(cfg, seed=...)`, a file `model.safetensors`.\n"
            "```bash\ndvc exp run -S 'agent=rag,react' -S sampling.temperature=abc  # refused\n"
            "python -m pipeline.core.config compose seed=3 workers=two\n```\n")
    assert config_mentions(text) == ["memory.topk=3", "memory.no_such_key=3", "agent=rag", "agent=nowhere", "seed=N",
                                     "env.nope=<n>", "memory.scene.read_scene_facts", "agent=rag,react",
                                     "sampling.temperature=abc", "seed=3", "workers=two"]
    bad = unknown_config(text)
    assert [b.split(":")[0] for b in bad] == ["memory.no_such_key=3", "agent=nowhere", "env.nope=<n>",
                                             "memory.scene.read_scene_facts", "workers=two"], bad
    assert "no key memory.scene.read_scene_facts" in bad[3]


def test_the_docs_have_config_to_check():
    mentions = [t for d in DOCS for t in config_mentions(d.read_text(encoding="utf-8"))]
    assert len(mentions) >= 100 and set(REFUSED) <= set(mentions)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_config_key_the_docs_name_composes(doc):
    bad = unknown_config(doc.read_text(encoding="utf-8"))
    assert not bad, f"{doc.relative_to(ROOT)}: config that does not compose:\n" + "\n".join(bad)


# -- source paths and Python names --------------------------------------------------------------

_SOURCE_PATH = re.compile(r"(?<![\w/.])((?:pipeline|conf|tests|benchmarks|hydra_plugins|\.ci)/[\w./*-]*[\w*])")
_PY_NAME = re.compile(r"(?<![\w/.])(pipeline(?:\.\w+)+)")


def _resolves(dotted: str) -> bool:
    """``pipeline.a.b.name``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def missing_names(text: str, root: Path = ROOT) -> list[str]:
    """Each source path in inline code that matches no file (globs allowed; ``<x>`` placeholders
    skipped) and each ``pipeline.<...>`` name that does not resolve."""
    bad = []
    for span in _CODE_SPAN.findall(_prose(text)):
        for path in _SOURCE_PATH.findall(span):
            if "<" not in span and not any(root.glob(path)):
                bad.append(f"{path}: no such file")
        for name in _PY_NAME.findall(span):
            if not _resolves(name):
                bad.append(f"{name}: does not resolve")
    return bad


def test_a_missing_path_or_name_is_reported():
    text = ("`pipeline/core/io.py`, `conf/env/*.yaml`, `pipeline/core/gone.py`, `pipeline.core.io.atomic_write_json`,\n"
            "`pipeline.core.io.no_such_function`, `pipeline.nowhere`, `data/eval/<condition>/`\n")
    assert missing_names(text) == ["pipeline/core/gone.py: no such file", "pipeline.core.io.no_such_function: does not "
                                   "resolve", "pipeline.nowhere: does not resolve"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_source_path_and_python_name_the_docs_name_exists(doc):
    bad = missing_names(doc.read_text(encoding="utf-8"))
    assert not bad, f"{doc.relative_to(ROOT)}: names of nothing:\n" + "\n".join(bad)


# -- the README ---------------------------------------------------------------------------------

README_WORDS = 1000  # a five-minute read; the rest is in docs/


def test_the_readme_is_short():
    words = len((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert words <= README_WORDS, f"README.md has {words} words (at most {README_WORDS}: move detail to docs/)"


def map_entries(readme: str) -> set[str]:
    """The paths the README's repository map names (the code block under its heading)."""
    section = readme.split("## Repository map", 1)[1]
    block = _FENCE.search(section)
    assert block, "the repository map is a code block under '## Repository map'"
    names = set()
    for line in block[0].splitlines()[1:-1]:
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        names |= {n.strip().rstrip("/") for n in head.split(",") if n.strip()}
    return names


def test_the_repository_map_names_every_folder_and_package():
    """Every top-level folder git tracks (but .dvc) and every package of pipeline/ is in the map."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    top = {p.split("/")[0] for p in tracked.stdout.splitlines() if "/" in p} - {".dvc"}
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "pipeline").glob("*/__init__.py")}
    names = map_entries((ROOT / "README.md").read_text(encoding="utf-8"))
    covered = names | {n.split("/")[0] for n in names}  # pipeline/ is named by its packages
    missing = sorted((top - covered) | (packages - names))
    assert not missing, f"README.md's repository map lacks {', '.join(missing)}"
    assert {"dvc.yaml", "pipeline/core", "pipeline/users"} <= names
