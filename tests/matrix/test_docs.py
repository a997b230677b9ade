"""The documentation checks itself: its C++ and Python excerpts are the text of the example
that every matrix cell compiles and tests, and every relative link leads somewhere.

An excerpt is an HTML comment naming a marked region of a source file (the path from the
repository root), then a fenced block:

    <!-- readme:registration from examples/third_party_backend/csrc/tinydev.cpp -->
    ```cpp
    TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
    ...
    ```

In the source file the region lies between the lines ``// [readme:registration]`` and
``// [/readme:registration]`` (``#`` in Python). The block must equal the region's lines
exactly, marker lines left out and blank lines at its two edges trimmed. To change an
excerpt, change the example (CI compiles it), then copy the region into the doc.

No torch needed: these run with the tooling's tests.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# The documentation: the README, the design pages, the benchmarks' and the matrix's manuals.
DOC_GLOBS = ("README.md", "docs/*.md", "benchmarks/README.md", "src/fallback_matrix/README.md")
# Where marked regions live: the example every cell builds against the installed wheel.
EXAMPLE = "examples/third_party_backend"
EXAMPLE_SOURCES = ("*.py", "*.cpp", "*.h")

EXCERPT = re.compile(r"^\s*<!--\s*readme:([\w-]+)\s+from\s+(\S+)\s*-->\s*$")
MARKER = re.compile(r"^\s*(?://|#)\s*\[(/?)readme:([\w-]+)\]\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"  # [text], one level of nested brackets allowed
    r"\(\s*<?([^()\s<>]*)>?(?:\s+\"[^\"]*\")?\s*\)"  # (target "title")
)
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def doc_files(root: Path = REPO_ROOT) -> list[Path]:
    return sorted({path for pattern in DOC_GLOBS for path in root.glob(pattern)})


def relative(path: Path, root: Path = REPO_ROOT) -> str:
    return path.relative_to(root).as_posix()


# ---- excerpts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Excerpt:
    doc: Path
    line: int  # of the HTML comment, 1-based
    name: str
    source: str  # path from the repository root
    block: str | None  # the fenced block's text; None where no block follows
    problem: str | None = None


def excerpts(doc: Path) -> list[Excerpt]:
    """Every excerpt comment in ``doc`` with the fenced block that follows it."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    found = []
    for index, line in enumerate(lines):
        match = EXCERPT.match(line)
        if match is None:
            continue
        name, source = match.groups()
        start = index + 1
        while start < len(lines) and not lines[start].strip():
            start += 1
        opening = FENCE.match(lines[start]) if start < len(lines) else None
        if opening is None:
            found.append(
                Excerpt(doc, index + 1, name, source, None, "no fenced block follows the comment")
            )
            continue
        fence = opening.group(2)
        end = start + 1
        while end < len(lines) and not (
            lines[end].strip().startswith(fence[0] * len(fence))
            and not lines[end].strip().strip(fence[0])
        ):
            end += 1
        if end == len(lines):
            found.append(Excerpt(doc, index + 1, name, source, None, "its block never closes"))
            continue
        found.append(Excerpt(doc, index + 1, name, source, "\n".join(lines[start + 1 : end])))
    return found


def marked_regions(path: Path) -> dict[str, str]:
    """{name: text} of every marked region of ``path``; a broken marker raises ValueError."""
    lines = path.read_text(encoding="utf-8").splitlines()
    opened: dict[str, int] = {}
    regions: dict[str, str] = {}
    for index, line in enumerate(lines):
        match = MARKER.match(line)
        if match is None:
            continue
        closing, name = match.group(1) == "/", match.group(2)
        if not closing:
            if name in opened or name in regions:
                raise ValueError(f"{path}:{index + 1}: region [readme:{name}] opens twice")
            opened[name] = index
            continue
        if name not in opened:
            raise ValueError(f"{path}:{index + 1}: [/readme:{name}] closes a region never opened")
        body = [text for text in lines[opened.pop(name) + 1 : index] if not MARKER.match(text)]
        while body and not body[0].strip():
            body.pop(0)
        while body and not body[-1].strip():
            body.pop()
        regions[name] = "\n".join(body)
    if opened:
        raise ValueError(f"{path}: region(s) {sorted(opened)} never closed")
    return regions


def excerpt_problem(excerpt: Excerpt, root: Path = REPO_ROOT) -> str | None:
    """Why ``excerpt`` is not its source's region, or None where it is."""
    where = (
        f"{relative(excerpt.doc, root)}:{excerpt.line}: "
        f"<!-- readme:{excerpt.name} from {excerpt.source} -->"
    )
    if excerpt.problem is not None:
        return f"{where}: {excerpt.problem}"
    source = root / excerpt.source
    if not source.is_file():
        return f"{where}: {excerpt.source} does not exist"
    try:
        regions = marked_regions(source)
    except ValueError as error:
        return f"{where}: {error}"
    if excerpt.name not in regions:
        return (
            f"{where}: {excerpt.source} has no region [readme:{excerpt.name}] (its regions: "
            f"{sorted(regions) or 'none'})"
        )
    expected = regions[excerpt.name]
    if excerpt.block == expected:
        return None
    diff = "\n".join(
        difflib.unified_diff(
            expected.splitlines(),
            (excerpt.block or "").splitlines(),
            f"{excerpt.source} [readme:{excerpt.name}]",
            f"{relative(excerpt.doc, root)} (the block after line {excerpt.line})",
            lineterm="",
        )
    )
    return (
        f"{where}: the fenced block differs from the region [readme:{excerpt.name}] of "
        f"{excerpt.source}. The example is what CI compiles: copy its region, without the "
        f"marker lines, into the doc.\n{diff}"
    )


# ---- links ------------------------------------------------------------------------------


def outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced blocks."""
    kept = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if fence is None and match is not None:
            fence = match.group(2)
        elif fence is not None:
            stripped = line.strip()
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                fence = None
        else:
            kept.append((number, line))
    return kept


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced blocks, inline code spans blanked out."""
    return [
        (number, re.sub(r"(`+)(?:(?!\1).)+?\1", "``", line))
        for number, line in outside_fences(text)
    ]


def anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives ``doc``'s headings: lower case, punctuation dropped, spaces
    to hyphens, a repeated one numbered (-1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in outside_fences(doc.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match is None:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(2))
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(f"{slug}-{count}" if count else slug)
    return found


def link_targets(doc: Path) -> list[tuple[int, str]]:
    targets = []
    for number, line in prose_lines(doc.read_text(encoding="utf-8")):
        targets += [(number, match.group(1)) for match in INLINE_LINK.finditer(line)]
        reference = REFERENCE_LINK.match(line)
        if reference is not None:
            targets.append((number, reference.group(1)))
    return targets


def broken_links(doc: Path, root: Path = REPO_ROOT) -> list[str]:
    """Every relative link of ``doc`` that leads nowhere: a missing path, a path outside
    the repository, or an anchor no heading of its markdown file has."""
    broken = []
    for number, target in link_targets(doc):
        if not target or URL_SCHEME.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        if path_part.startswith("/"):
            resolved = (root / path_part.lstrip("/")).resolve()
        elif path_part:
            resolved = (doc.parent / path_part).resolve()
        else:
            resolved = doc.resolve()
        where = f"{relative(doc, root)}:{number}: ({target})"
        if not resolved.is_relative_to(root.resolve()):
            broken.append(f"{where} leaves the repository")
        elif not resolved.exists():
            broken.append(f"{where}: {relative(resolved, root.resolve())} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{where}: {relative(resolved, root.resolve())} has no heading #{anchor}")
    return broken


# ---- the tests --------------------------------------------------------------------------

ALL_EXCERPTS = [excerpt for doc in doc_files() for excerpt in excerpts(doc)]


def test_the_docs_exist() -> None:
    docs = {relative(path) for path in doc_files()}
    for required in ("README.md", "benchmarks/README.md", "src/fallback_matrix/README.md"):
        assert required in docs, f"{required} is missing"
    assert any(name.startswith("docs/") for name in docs), "docs/ has no design page"


def test_the_readme_quotes_the_compiled_example() -> None:
    quoted = [excerpt for excerpt in ALL_EXCERPTS if excerpt.doc == REPO_ROOT / "README.md"]
    assert quoted, (
        "README.md quotes no region of the example (<!-- readme:NAME from PATH --> before a "
        "fenced block): its C++ must be code that CI compiles"
    )
    outside = [e.source for e in quoted if not e.source.startswith(f"{EXAMPLE}/")]
    assert not outside, f"README.md's excerpts must come from {EXAMPLE}/, not {outside}"


@pytest.mark.parametrize(
    "excerpt",
    ALL_EXCERPTS,
    ids=[f"{relative(e.doc)}:{e.name}" for e in ALL_EXCERPTS],
)
def test_excerpt_equals_its_marked_region(excerpt: Excerpt) -> None:
    problem = excerpt_problem(excerpt)
    assert problem is None, problem


def test_every_marked_region_is_quoted() -> None:
    """A region no doc quotes is a leftover: remove its markers or quote it."""
    quoted = {(excerpt.source, excerpt.name) for excerpt in ALL_EXCERPTS}
    leftovers = []
    for pattern in EXAMPLE_SOURCES:
        for source in sorted((REPO_ROOT / EXAMPLE).rglob(pattern)):
            if "build" in source.relative_to(REPO_ROOT / EXAMPLE).parts:
                continue
            for name in marked_regions(source):
                if (relative(source), name) not in quoted:
                    leftovers.append(f"{relative(source)} [readme:{name}]")
    assert not leftovers, f"marked regions no doc quotes: {leftovers}"


@pytest.mark.parametrize("doc", doc_files(), ids=relative)
def test_relative_links_resolve(doc: Path) -> None:
    broken = broken_links(doc)
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


# ---- the checks themselves fail where they should ------------------------------------------


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_a_changed_excerpt_fails(tmp_path: Path) -> None:
    _write(
        tmp_path / "src/a.cpp",
        "int x;\n// [readme:part]\nint f() { return 1; }\n// [/readme:part]\n",
    )
    doc = _write(
        tmp_path / "README.md",
        "<!-- readme:part from src/a.cpp -->\n```cpp\nint f() { return 2; }\n```\n",
    )
    (changed,) = excerpts(doc)
    problem = excerpt_problem(changed, tmp_path)
    assert problem is not None
    assert "[readme:part]" in problem and "src/a.cpp" in problem
    assert "-int f() { return 1; }" in problem and "+int f() { return 2; }" in problem

    _write(doc, "<!-- readme:part from src/a.cpp -->\n```cpp\nint f() { return 1; }\n```\n")
    (same,) = excerpts(doc)
    assert excerpt_problem(same, tmp_path) is None


def test_a_missing_region_or_block_fails(tmp_path: Path) -> None:
    _write(tmp_path / "a.py", "# [readme:one]\nx = 1\n# [/readme:one]\n")
    doc = _write(
        tmp_path / "README.md",
        "<!-- readme:two from a.py -->\n```python\nx = 1\n```\n\n"
        "<!-- readme:one from a.py -->\nno block\n\n"
        "<!-- readme:one from b.py -->\n```python\nx = 1\n```\n",
    )
    problems = [excerpt_problem(excerpt, tmp_path) for excerpt in excerpts(doc)]
    assert "has no region [readme:two]" in str(problems[0])
    assert "no fenced block follows" in str(problems[1])
    assert "b.py does not exist" in str(problems[2])


def test_a_broken_link_fails(tmp_path: Path) -> None:
    _write(tmp_path / "docs/page.md", "# A page\n\n## Its part\n")
    doc = _write(
        tmp_path / "README.md",
        "[ok](docs/page.md) [ok](docs/page.md#its-part) [web](https://example.org/x)\n"
        "[gone](docs/gone.md) [anchor](docs/page.md#nowhere) `[code](not/checked.md)`\n"
        "```\n[in a block](not/checked/either.md)\n```\n",
    )
    broken = broken_links(doc, tmp_path)
    assert len(broken) == 2, broken
    assert "docs/gone.md does not exist" in broken[0]
    assert "has no heading #nowhere" in broken[1]
