"""The documents' references stay true: every citation of a note names a note and a heading
that exist, every "ARCHITECTURE §N" a section that exists, every repository path the front
pages name a file that exists, and nothing cites the retired lab notebook any more.

Code cites the reasons for its choices as `docs/notes/<topic>.md, "Heading"` (docs/notes/
README.md); a renamed heading or a moved note would otherwise break such a citation silently.
Each check is a function over a checkout that returns its problems; the tests run them on this
repository and, on a small tree built in tmp_path, prove each one can fail.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".sh", ".c", ".cc", ".cpp", ".h", ".hpp", ".inc", ".cu", ".cuh", ".md",
                 ".toml", ".txt", ".json", ".cfg", ".ini", ".yml", ".yaml"}
RETIRED = "bench/" + "NOTES.md"   # split so that this file does not cite it
# the documents whose paths must exist (the History parts of the notes are a record: the paths
# they name are the paths of their day, and stay as written)
FRONT_PAGES = ("README.md", "glai_kernels/backends/README.md")   # and docs/**/*.md
PATH_SUFFIXES = (".py", ".md", ".json", ".csv", ".png", ".html", ".cpp", ".h", ".inc", ".cu",
                 ".cuh", ".sh", ".toml", ".txt")

# a line break inside a cited heading, with the comment marker that starts the next line
_BREAK = r"[ \t]*\n[ \t]*(?:#|//|\*)?[ \t]*"
NOTE_CITE = re.compile(r"docs/notes/(?P<file>[\w.\-]+\.md)(?P<anchor>#[\w\-]+)?")
ARCH_CITE = re.compile(r"ARCHITECTURE(?:\.md)?`?[ \t]*(?:\n[ \t]*(?:#|//|\*)?[ \t]*)?"
                       r"(?P<secs>§\d+(?:\.\d+)?(?:[ \t]*(?:–|-|and|,|or)[ \t]*§\d+(?:\.\d+)?)*)")
ARCH_ANCHOR = re.compile(r"ARCHITECTURE\.md#(?P<anchor>[\w\-]+)")
QUOTES = {'"': '"', "'": "'", "“": "”"}


def tracked_files(root: Path) -> list[str]:
    """The checkout's tracked files ('/'-separated, relative); the tree walked without git."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], check=True,
                             capture_output=True, timeout=30).stdout.decode()
        files = [f for f in out.split("\0") if f and (root / f).is_file()]
        if files:
            return files
    except (OSError, subprocess.SubprocessError):
        pass
    skip = {".git", ".nox", "__pycache__", ".venv", "node_modules", ".pytest_cache"}
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        found += [Path(folder, n).relative_to(root).as_posix() for n in names]
    return found


def text_files(root: Path, files: list[str]) -> dict[str, str]:
    """Path -> text of every tracked text file (by suffix, and .ci/run)."""
    texts = {}
    for f in files:
        if Path(f).suffix in TEXT_SUFFIXES or f == ".ci/run":
            try:
                texts[f] = (root / f).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
    return texts


def anchor_of(heading: str) -> str:
    """GitHub's anchor: inline markup and punctuation dropped, lowercased, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[str]:
    """The Markdown headings of `text`, outside fenced code."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+?)\s*#*\s*$", line)):
            found.append(m.group(1))
    return found


def anchors(text: str) -> set[str]:
    """Anchors of the headings, with GitHub's -1, -2 for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for h in headings(text):
        a = anchor_of(h)
        out.add(a if a not in seen else f"{a}-{seen[a]}")
        seen[a] = seen.get(a, 0) + 1
    return out


def normalise(cited: str) -> str:
    """A heading as cited: line breaks and their comment markers out, '...' or '…' cut off."""
    text = re.sub(_BREAK, " ", cited)
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"\s*(\.\.\.|…)$", "", text).strip()


def quoted_after(text: str, pos: int) -> list[str]:
    """The headings quoted right after a citation's path: `, "A"`, ` ("A")`, and more chained
    with `, ` or ` and ` (`"A", "B" and "C"`); a line break may fall anywhere between."""
    cited = []
    m = re.compile(r"(?:,|:)?[ \t]*(?:\n[ \t]*(?:#|//|\*)?[ \t]*)?\(?").match(text, pos)
    i = m.end()
    while i < len(text) and text[i] in QUOTES:
        close = QUOTES[text[i]]
        j = text.find(close, i + 1)
        while close == "'" and j != -1 and text[j + 1:j + 2].isalpha():  # "Issue 15's"
            j = text.find(close, j + 1)
        if j == -1 or j - i > 300:
            break
        cited.append(text[i + 1:j])
        m = re.compile(r"(?:,|[ \t]+and)[ \t]*(?:\n[ \t]*(?:#|//|\*)?[ \t]*)?").match(text, j + 1)
        if not m:
            break
        i = m.end()
    return cited


def note_citation_problems(root: Path, texts: dict[str, str]) -> list[str]:
    """Citations of docs/notes/<file>.md (and its #anchor, and the quoted headings after it)
    that name a note or a heading that does not exist. The first quoted heading must begin a
    heading of that note (a citation may cut it short); one chained after it must occur in one."""
    problems = []
    notes = {p.name: p.read_text(encoding="utf-8") for p in (root / "docs/notes").glob("*.md")}
    for path, text in texts.items():
        for m in NOTE_CITE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            where = f"{path}:{line}: docs/notes/{m.group('file')}"
            note = notes.get(m.group("file"))
            if note is None:
                problems.append(f"{where}: no such note")
                continue
            if m.group("anchor") and m.group("anchor")[1:] not in anchors(note):
                problems.append(f"{where}{m.group('anchor')}: no such heading")
            heads = [re.sub(r"\s+", " ", h) for h in headings(note)]
            for k, cited in enumerate(quoted_after(text, m.end())):
                want = normalise(cited)
                ok = (any(h.startswith(want) for h in heads) if k == 0
                      else any(want.lower() in h.lower() for h in heads))
                if not want or not ok:
                    problems.append(f"{where}: no heading {want!r}")
    return problems


def architecture_sections(text: str) -> set[str]:
    """'N' for each `## N. Title`, 'N.M' for each `### N.M` heading and each numbered point
    `M.` of section N (ARCHITECTURE cites "§4.7" for point 7 of §4)."""
    found: set[str] = set()
    section = None
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if m := re.match(r"## (\d+)\.? ", line):
            section = m.group(1)
            found.add(section)
        elif m := re.match(r"###+ (\d+)\.(\d+)\b", line):
            found.add(f"{m.group(1)}.{m.group(2)}")
        elif section and (m := re.match(r"(\d+)\. ", line)):
            found.add(f"{section}.{m.group(1)}")
    return found


def architecture_problems(root: Path, texts: dict[str, str]) -> list[str]:
    """`ARCHITECTURE.md §N` (§N.M, "§1–§2") and `ARCHITECTURE.md#anchor` citations of a section
    that docs/ARCHITECTURE.md does not have."""
    arch = root / "docs/ARCHITECTURE.md"
    if not arch.is_file():
        return ["docs/ARCHITECTURE.md: missing"]
    arch_text = arch.read_text(encoding="utf-8")
    sections, arch_anchors = architecture_sections(arch_text), anchors(arch_text)
    problems = []
    for path, text in texts.items():
        for m in ARCH_CITE.finditer(text):
            for sec in re.findall(r"§(\d+(?:\.\d+)?)", m.group("secs")):
                if sec not in sections:
                    line = text.count("\n", 0, m.start()) + 1
                    problems.append(f"{path}:{line}: ARCHITECTURE.md §{sec}: no such section")
        for m in ARCH_ANCHOR.finditer(text):
            if m.group("anchor") not in arch_anchors:
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{path}:{line}: ARCHITECTURE.md#{m.group('anchor')}: no such "
                                "heading")
    return problems


def _looks_like_repo_path(token: str, top: set[str]) -> bool:
    if not re.fullmatch(r"[\w.\-/]+", token) or "/" not in token or token.startswith("/"):
        return False
    if ".." in token.split("/") or "//" in token:
        return False
    return token.endswith(PATH_SUFFIXES) or token.split("/")[0] in top


def _exists(token: str, base: str, root: Path, files: set[str], folders: set[str]) -> bool:
    """A path exists relative to the root or to the citing document's folder, or names the end
    of a tracked path (`csrc/eager_autograd.cpp` in a page about glai_kernels/)."""
    token = token.rstrip("/")
    for cand in (token, os.path.normpath(os.path.join(base, token)).replace(os.sep, "/")):
        if cand in files or cand in folders or (root / cand).exists():
            return True
    return any(f.endswith("/" + token) for f in files | folders)


def front_page_paths(root: Path, files: list[str]) -> list[str]:
    """Repository paths named in README.md, docs/**/*.md (not the notes' History parts) and
    glai_kernels/backends/README.md that do not exist: Markdown link targets (and, for a
    Markdown target, its #anchor) and backticked paths that look like this repository's."""
    fileset = set(files)
    folders = {"/".join(f.split("/")[:k]) for f in files for k in range(1, f.count("/") + 1)}
    top = {f.split("/")[0] for f in files if "/" in f}
    pages = sorted(f for f in files if f in FRONT_PAGES
                   or (f.startswith("docs/") and f.endswith(".md")))
    problems = []
    for page in pages:
        text = (root / page).read_text(encoding="utf-8")
        if page.startswith("docs/notes/") and "\n## History" in text:
            text = text.split("\n## History", 1)[0]
        text_no_code = re.sub(r"```.*?```", "", text, flags=re.S)
        base = str(Path(page).parent)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text_no_code):
            target = m.group(1)
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(base, file_part)).replace(os.sep, "/")
            if not (root / resolved).exists():
                problems.append(f"{page}: link to {target}: {resolved} does not exist")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(
                    (root / resolved).read_text(encoding="utf-8")):
                problems.append(f"{page}: link to {target}: no heading #{anchor}")
        for m in re.finditer(r"`([^`\n]+)`", text_no_code):
            token = m.group(1).strip()
            if _looks_like_repo_path(token, top) and not _exists(token, base, root, fileset,
                                                                  folders):
                problems.append(f"{page}: `{token}` does not exist")
    return problems


def retired_notebook_mentions(texts: dict[str, str]) -> list[str]:
    """Tracked files that still name the retired lab notebook."""
    return [f"{path}:{text.count(chr(10), 0, text.find(RETIRED)) + 1}: names {RETIRED}"
            for path, text in texts.items() if RETIRED in text]


@pytest.fixture(scope="module")
def repo():
    files = tracked_files(ROOT)
    texts = text_files(ROOT, files)
    texts.pop(Path(__file__).resolve().relative_to(ROOT).as_posix(), None)  # its own examples
    return files, texts


def test_note_citations_name_existing_headings(repo):
    assert note_citation_problems(ROOT, repo[1]) == []


def test_architecture_citations_name_existing_sections(repo):
    assert architecture_problems(ROOT, repo[1]) == []


def test_front_pages_name_existing_paths(repo):
    assert front_page_paths(ROOT, repo[0]) == []


def test_nothing_cites_the_retired_notebook(repo):
    assert retired_notebook_mentions(repo[1]) == []


# ---- each check can fail ----------------------------------------------------------------

NOTE = """# A topic

## Current state

Holds (see "The first try").

## History

### The first try (stop 3)

Text.

### Issue 15's targets at stop 28 (three sweeps)
"""

ARCH = """# Architecture

## 1. The op

## 4. The pipeline

1. **Reduced MLP.**
2. **Selector.**

### 4.9 A sub-section
"""


def _tree(tmp_path: Path, files: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    for name, text in {"docs/notes/topic.md": NOTE, "docs/ARCHITECTURE.md": ARCH,
                       **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    listed = tracked_files(tmp_path)
    return listed, text_files(tmp_path, listed)


def test_a_citation_of_a_missing_note_or_heading_fails(tmp_path):
    good = ('# docs/notes/topic.md, "The first try"\n'
            '// docs/notes/topic.md, "Issue 15\'s targets at\n// stop 28 ..."\n'
            "x = 1  # docs/notes/topic.md, 'Issue 15's targets', 'first try'\n"
            '"""(docs/notes/topic.md, "The first try (stop 3)" and "the\n    first try")."""\n'
            "see [it](docs/notes/topic.md#the-first-try-stop-3)\n")
    _, texts = _tree(tmp_path, {"a.py": good})
    assert note_citation_problems(tmp_path, texts) == []
    bad = {"b.py": '# docs/notes/topic.md, "The second try"\n',
           "c.cpp": '// docs/notes/topic.md, "The first\n// attempt"\n',
           "d.md": "docs/notes/gone.md, \"The first try\"\n",
           "e.md": "[x](docs/notes/topic.md#the-second-try)\n",
           "f.py": '# docs/notes/topic.md, "The first try", "a heading nowhere"\n',
           "g.py": "# docs/notes/topic.md, 'The first try…'\n# docs/notes/topic.md, 'Text'\n"}
    _, texts = _tree(tmp_path, bad)
    problems = note_citation_problems(tmp_path, texts)
    assert {p.split(":")[0] for p in problems} == {"b.py", "c.cpp", "d.md", "e.md", "f.py",
                                                   "g.py"}, problems
    assert any("g.py:2" in p for p in problems), problems   # body text is not a heading


def test_a_citation_of_a_missing_architecture_section_fails(tmp_path):
    good = ("docs/ARCHITECTURE.md §1 and §4.2, `docs/ARCHITECTURE.md` §1–§4, ARCHITECTURE §4.9\n"
            "[the op](docs/ARCHITECTURE.md#1-the-op)\n")
    _, texts = _tree(tmp_path, {"a.md": good})
    assert architecture_problems(tmp_path, texts) == []
    _, texts = _tree(tmp_path, {"a.md": good, "b.py": "# docs/ARCHITECTURE.md §7\n",
                                "c.py": "# ARCHITECTURE §4.3\n",
                                "d.md": "(docs/ARCHITECTURE.md#6-the-code-path)\n",
                                "e.md": "docs/ARCHITECTURE.md §1–§5\n"})
    problems = architecture_problems(tmp_path, texts)
    assert sorted(p.split(":")[0] for p in problems) == ["b.py", "c.py", "d.md", "e.md"], problems


def test_a_front_page_naming_a_missing_path_fails(tmp_path):
    pages = {"README.md": "See [notes](docs/notes/README.md), `glai_kernels/op.py`, "
                          "`bench/` and [a](docs/notes/topic.md#the-first-try-stop-3).\n",
             "docs/notes/README.md": "[topic](topic.md) and `csrc/op.cpp`\n",
             "glai_kernels/op.py": "", "glai_kernels/csrc/op.cpp": "", "bench/x.py": "",
             "glai_kernels/backends/README.md": "`glai_kernels/op.py`\n"}
    listed, _ = _tree(tmp_path, pages)
    assert front_page_paths(tmp_path, listed) == []
    broken = {**pages,
              "README.md": pages["README.md"] + "[gone](reports/gone.md), `glai_kernels/heads.py`"
                                                "\n[h](docs/notes/topic.md#no-such)\n",
              "docs/notes/topic.md": NOTE.replace("## History", "`bench/old.py`\n\n## History")
                                     + "`bench/older.py` (a record: not checked)\n",
              "glai_kernels/backends/README.md": "`glai_kernels/backends/toy.py`\n"}
    listed, _ = _tree(tmp_path, broken)
    problems = front_page_paths(tmp_path, listed)
    assert len(problems) == 5, problems
    assert not any("older.py" in p for p in problems), problems


def test_a_file_naming_the_retired_notebook_fails(tmp_path):
    _, texts = _tree(tmp_path, {"a.py": "# fine: docs/notes/topic.md\n",
                                "b.cpp": "// see " + RETIRED + ", \"X\"\n"})
    assert retired_notebook_mentions(texts) == ["b.cpp:1: names " + RETIRED]


def test_the_tree_is_walked_without_git(tmp_path, monkeypatch):
    _tree(tmp_path, {"sub/a.md": "x"})
    monkeypatch.setenv("PATH", "")   # no git to run
    assert "sub/a.md" in tracked_files(tmp_path)
