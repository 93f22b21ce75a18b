"""The package's layout stays findable: imports go down one order, and no two modules share a name.

The order is docs/architecture.md §2's: records < policy < sandbox < broker <
wake < fleet < views < console < cli, with errors.py and assets.py under
everything, escapes/ beside console/ at the top (each attacks or runs the
other), and the leaves (notify/, metrics.py, tracing.py, healthcheck.py,
testing/) importable from anywhere while they import only records/, errors.py,
assets.py and each other. An import inside a function counts as much as one
at the top.

Two modules called `files` (one writing state/, one reading the workspace) made a reader
open the wrong one and an import need an alias to say which it meant. A name
here says the idea (records/atomic.py, sandbox/workspace_reads.py), once.
`__init__.py` is the one name every package has.

No engine needed. Not here: names cited in prose (test_names.py).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"

# Bottom first; a package may import its own rank and those before it. A top-level module is its own name.
RANKS = [{"errors", "assets", "__init__"}, {"records"}, {"policy"}, {"sandbox"}, {"broker"}, {"wake"}, {"fleet"},
         {"views"}, {"console", "escapes"}, {"cli", "__main__"}]
LEAVES = {"notify", "metrics", "tracing", "healthcheck", "testing"}
LEAVES_MAY_IMPORT = {"errors", "assets", "__init__", "records"} | LEAVES
# Arrows that run the wrong way today, each with why it is still there. Remove one once it is gone.
KNOWN = {
    ("notify/config.py", "policy"): "line_of and the no-alias YAML reader are in policy/schema.py (to move down)",
}


def shared_names(root: Path) -> dict[str, list[str]]:
    """File name -> the modules under `root` that have it, for names held by more than one."""
    where = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if path.name != "__init__.py" and "__pycache__" not in path.parts:
            where[path.name].append(path.relative_to(root).as_posix())
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def test_no_two_modules_share_a_name():
    shared = shared_names(PACKAGE)
    assert not shared, "name each module for its idea, once:\n  " + "\n  ".join(
        f"{name}: {', '.join(paths)}" for name, paths in sorted(shared.items()))


def test_the_check_sees_a_shared_name(tmp_path):
    for rel in ("a/__init__.py", "b/__init__.py", "a/files.py", "b/files.py", "a/only.py"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text("")
    assert shared_names(tmp_path) == {"files.py": ["a/files.py", "b/files.py"]}
    assert len(list(PACKAGE.rglob("*.py"))) > 100      # the real check reads the real package


def _part(module: str) -> str:
    """orchestrator.X.Y -> X: the package (or top-level module) an import lands in."""
    return (module.split(".") + ["__init__"])[1]


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "orchestrator":
            found |= ({f"orchestrator.{a.name}" for a in node.names} if node.module == "orchestrator"
                      else {node.module})
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "orchestrator"}
    return found


def _rank(part: str) -> int:
    return next(i for i, members in enumerate(RANKS) if part in members)


def wrong_way(root: Path) -> set[tuple[str, str]]:
    """(importing file, package imported) for every import that goes up the order."""
    bad = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        src = rel.split("/")[0].removesuffix(".py")
        for module in _imports(path):
            dst = _part(module)
            if dst in (src, "__version__"):
                continue
            if src in LEAVES:
                ok = dst in LEAVES_MAY_IMPORT
            else:
                ok = dst in LEAVES or _rank(dst) <= _rank(src)
            if not ok:
                bad.add((rel, dst))
    return bad


def test_imports_go_down_the_order():
    bad = sorted(wrong_way(PACKAGE) - set(KNOWN))
    assert not bad, ("these imports go up docs/architecture.md §2's order (move the code down, or the import "
                     "into the caller):\n  " + "\n  ".join(f"{rel} imports {dst}/" for rel, dst in bad))


def test_the_order_check_sees_an_arrow_up(tmp_path):
    for rel, text in (("records/a.py", "from orchestrator.fleet import x"),
                      ("fleet/b.py", "def f():\n    import orchestrator.views.status"),
                      ("notify/c.py", "from orchestrator.wake.loop import Receipt"),
                      ("views/d.py", "from orchestrator.fleet import x\nfrom orchestrator import metrics"),
                      ("wake/e.py", "from orchestrator.notify import outcomes")):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert wrong_way(tmp_path) == {("records/a.py", "fleet"), ("fleet/b.py", "views"), ("notify/c.py", "wake")}
    assert all(_part(m) in set().union(*RANKS) | LEAVES for p in PACKAGE.rglob("*.py") for m in _imports(p)
               if _part(m) != "__version__"), "a package of orchestrator/ is in no rank: add it to RANKS"
