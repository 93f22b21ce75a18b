"""Names in prose stay true: every file a docstring, a comment or a doc names exists.

Read: every docstring and comment of the Python under orchestrator/, tests/
and bench/, the README and docs/*.md. A name is one of:

- a bare `name.py` or `name.sh`: some file of that name is in the repository;
- a bare `NAME.md` in capitals (README.md): that file exists (DESIGN.md,
  kept outside the repository, is caught);
- a path (`sandbox/engine.py`, `tests/escapes/test_weakened.py`,
  `orchestrator/escapes/`): it exists, from the repository's root or under
  any folder of it (`surfaces/console.py` is orchestrator/escapes/surfaces/);
  a .md, .yaml or folder path is checked only when it starts at one of the
  repository's folders or orchestrator's packages, since `state/events.jsonl`,
  `memory/core.md` and `ROOT/notify.yaml` name an agent's files, not ours.

Not names of ours: an absolute path (`/etc/docker/daemon.json`), a URL, and
the few entries of ALLOWED, each with its reason. Also checked: a dotted
module (`orchestrator.escapes`, `python -m orchestrator.healthcheck`) is a
package or module of ours; a citation `docs/architecture.md §N` names a
section that exists; a citation of a page's section by its title
(`docs/security.md, "Known gaps"`, `README: "Tests"`) names a heading of that
page; and every function, class and constant named in docs/architecture.md §6
is defined in a file it names.

No engine needed. Not here: whether the prose is right, only that it names
what is there.
"""

from __future__ import annotations

import ast
import functools
import io
import os
import re
import tokenize
from pathlib import Path

from tests.helpers import REPO

ARCHITECTURE = REPO / "docs" / "architecture.md"
SELF = Path(__file__).resolve().relative_to(REPO).as_posix()
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "build", "dist", "node_modules", ".pytest_cache"}

# Names that are not files of ours, each with why it is named.
ALLOWED = {
    "x.py": "an example of the agent's own script, in a comment (policy/load.py)",
    "policies/NAME.yaml": "a placeholder for any shipped policy's name (assets.py)",
    "runtime/abstract.py": "SWE-ReX's typed requests, prior art (issue text, STYLE)",
    "remote_executors.py": "smolagents' executors, prior art",
    "message_parser.py": "the Claude Agent SDK's parser, prior art",
}

# A name: an optional run of folders, then a file with one of these suffixes; or folders alone.
# Not preceded by a character that makes it part of something longer: a word, a path, a URL.
NAME = re.compile(r"(?<![\w./:~$@%-])((?:[\w.-]+/)*[\w-]+\.(?:py|sh|md|yaml|yml|toml)|(?:[\w.-]+/)+)(?![\w/-])")
CITATION = re.compile(r"docs/architecture\.md\s+§\s*(\d+)")
# `orchestrator.views.logview` (a module), `orchestrator.escapes` (a package), `orchestrator.errors.ConfigError`.
DOTTED = re.compile(r"(?<![\w./-])(orchestrator(?:\.(?!py\b)[A-Za-z_]\w*)+)")  # not orchestrator.py, a file
# A page's section by its title: `README, "Threat model"`, `docs/security.md's "Known gaps"`, `README: "Tests"`.
TITLED = re.compile(r"(?<![\w/])(README(?:\.md)?|docs/[\w-]+\.md)(?:'s)?[,:]?\s+\"([^\"\n]+)\"")


def _repo_files() -> list[str]:
    found = []
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        rel = Path(folder).relative_to(REPO)
        found += [(rel / f).as_posix() for f in files]
    return found


FILES = _repo_files()
PATHS = set(FILES)
FOLDERS = {p.rsplit("/", i)[0] for p in FILES for i in range(1, p.count("/") + 1)}
BASENAMES = {p.rsplit("/", 1)[-1] for p in FILES}
TOP_FOLDERS = {p.split("/", 1)[0] for p in FILES if "/" in p}
PACKAGES = {p.split("/")[1] for p in FILES if p.startswith("orchestrator/") and p.count("/") >= 2}


@functools.cache
def _texts() -> list[tuple[str, int, str]]:
    """(file, line, text) for each docstring and comment of ours, and each doc page."""
    return list(_read_texts())


def _read_texts():
    for rel in FILES:
        if rel == SELF:
            continue  # this docstring names examples of what is checked
        path = REPO / rel
        if rel.endswith(".py") and rel.split("/", 1)[0] in ("orchestrator", "tests", "bench"):
            source = path.read_text(encoding="utf-8")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node, clean=False)
                    if doc:
                        yield rel, getattr(node, "lineno", 1), doc
            for tok in tokenize.generate_tokens(io.StringIO(source).readline):
                if tok.type == tokenize.COMMENT:
                    yield rel, tok.start[0], tok.string
        elif rel == "README.md" or (rel.startswith("docs/") and rel.endswith(".md")):
            yield rel, 1, path.read_text(encoding="utf-8")


def _exists(name: str, pool: set[str]) -> bool:
    """`name` is a path in `pool`, from the root or under some folder of it."""
    return name in pool or any(p.endswith("/" + name) for p in pool)


def missing(name: str) -> bool:
    """Whether `name`, as found in prose, names a file or folder of ours that is not there."""
    if name in ALLOWED:
        return False
    name = name.removeprefix("./")
    first = name.split("/", 1)[0]
    ours = first in TOP_FOLDERS or first in PACKAGES
    if name.endswith("/"):
        return ours and not _exists(name.rstrip("/"), FOLDERS)
    suffix = name.rsplit(".", 1)[1]
    if "/" not in name:
        if suffix in ("py", "sh") or (suffix == "md" and re.fullmatch(r"[A-Z][A-Z_]+", name[:-3])):
            return name not in BASENAMES
        return False
    return (suffix in ("py", "sh") or ours) and not _exists(name, PATHS)


def stale_names() -> list[str]:
    found = []
    for rel, line, text in _texts():
        for match in NAME.finditer(text):
            if missing(match.group(1)):
                where = line + text.count("\n", 0, match.start())
                found.append(f"{rel}:{where}: {match.group(1)}")
    return found


def test_every_file_named_in_prose_exists():
    stale = stale_names()
    assert not stale, (
        "these files or folders are named but not in the repository (fix the text, or add "
        "the name to ALLOWED with a reason if it is not ours):\n  " + "\n  ".join(stale)
    )


def test_the_check_sees_a_stale_name():
    # The rule itself, on names as the prose writes them: a moved module is caught,
    # an agent's file, a URL's path and an absolute path are not ours to check.
    assert missing("cli.py") and missing("broker/sandbox.py") and missing("DESIGN_NOT_HERE.md")
    assert missing("orchestrator/nowhere/") and missing("tests/escapes/test_nothing.py")
    assert not missing("sandbox/engine.py") and not missing("surfaces/console.py")
    assert not missing("tests/escapes/test_weakened.py") and not missing("orchestrator/escapes/")
    assert not missing("state/events.jsonl") and not missing("memory/journal/YYYY-MM-DD.md")
    assert not missing("ROOT/notify.yaml") and not missing("workspace/")
    urls = "see https://example.com/a/b.py and /etc/docker/daemon.json or ~/x/y.py"
    assert [m.group(1) for m in NAME.finditer(urls)] == []
    # And the scan reads what it should: docstrings, comments and the docs, hundreds of names.
    names = [m.group(1) for _, _, text in _texts() for m in NAME.finditer(text)]
    assert len(names) > 500 and "safeio/folder.py" in names and "docs/architecture.md" in names


def _sections(text: str) -> set[str]:
    return set(re.findall(r"^## (\d+)\.", text, re.MULTILINE))


def test_citations_of_the_architecture_name_a_section_that_exists():
    sections = _sections(ARCHITECTURE.read_text(encoding="utf-8"))
    bad = [f"{rel}:{line}: §{n}" for rel, line, text in _texts() for n in CITATION.findall(text) if n not in sections]
    assert not bad, f"docs/architecture.md has sections {sorted(sections, key=int)}; cited:\n  " + "\n  ".join(bad)


def test_every_section_sign_cites_the_architecture():
    # `DESIGN §3` (a file outside the repository) or a bare `§5` says nothing a reader can open.
    bad = [
        f"{rel}:{line + text.count(chr(10), 0, m.start())}: {text[max(0, m.start() - 30) : m.end()]!r}"
        for rel, line, text in _texts()
        if rel != "docs/architecture.md"
        for m in re.finditer(r"§\s*\d+", text)
        if not re.search(r"docs/architecture\.md\s+$", text[: m.start()])
    ]
    assert not bad, "cite a section as `docs/architecture.md §N`:\n  " + "\n  ".join(bad)


def _defined(path: Path) -> set[str]:
    """Top-level functions, classes and constants of a module, and Class.method."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}.{m.name}" for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_the_journey_of_a_tool_call_names_real_functions():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    journey = text[text.index("## 6.") :]
    spans = re.findall(r"`([^`]+)`", journey)
    files = [s for s in spans if s.endswith(".py")]
    assert all(_exists(f"orchestrator/{f}", PATHS) or f.startswith("tests/") for f in files), files
    defined = set().union(*(_defined(REPO / "orchestrator" / f) for f in files if not f.startswith("tests/")))
    # Checked: `name()` (a function or method) and CamelCase or CAPITAL names (a class, a constant).
    named = [s.removesuffix("()") for s in spans if s.endswith("()") or re.fullmatch(r"_?[A-Z]\w*(\.\w+)?", s)]
    assert len(named) >= 30  # the section names the path, not a summary of it
    unknown = [n for n in named if n not in defined]
    assert not unknown, f"docs/architecture.md §6 names what its files do not define: {unknown}"


def missing_module(dotted: str) -> bool:
    """Whether `orchestrator.a.b...` names no package or module of ours (what follows a module is its attribute)."""
    where = "orchestrator"
    for part in dotted.split(".")[1:]:
        if f"{where}/{part}.py" in PATHS:
            return False
        if f"{where}/{part}" not in FOLDERS:
            return True
        where += f"/{part}"
    return False


def test_every_module_named_in_prose_exists():
    bad = [
        f"{rel}:{line + text.count(chr(10), 0, m.start())}: {m.group(1)}"
        for rel, line, text in _texts()
        for m in DOTTED.finditer(text)
        if missing_module(m.group(1))
    ]
    assert not bad, "these modules are named but not in orchestrator/:\n  " + "\n  ".join(bad)
    assert missing_module("orchestrator.nowhere") and missing_module("orchestrator.fleet.nowhere")
    assert not missing_module("orchestrator.escapes") and not missing_module("orchestrator.errors.ConfigError")


def _headings(rel: str) -> list[str]:
    return re.findall(r"^#+ (.+)$", (REPO / rel).read_text(encoding="utf-8"), re.MULTILINE)


def test_sections_cited_by_title_exist():
    # A title names the heading it starts ("Threat model" is "Threat model: who attacks, ...").
    bad, seen = [], 0
    for rel, line, text in _texts():
        for m in TITLED.finditer(text):
            page = "README.md" if m.group(1).startswith("README") else m.group(1)
            seen += 1
            if not (REPO / page).is_file() or not any(
                h.lower().startswith(m.group(2).lower()) for h in _headings(page)
            ):
                bad.append(f'{rel}:{line + text.count(chr(10), 0, m.start())}: {page}, "{m.group(2)}"')
    assert seen >= 5, "the pattern no longer finds the citations"
    assert not bad, "these sections are cited by a title no heading of the page starts with:\n  " + "\n  ".join(bad)
