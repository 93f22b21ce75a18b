"""The package's layout stays findable: no two modules share a name, none is too long.

Two modules called `files` (one writing state/, one reading the workspace) made a reader
open the wrong one and an import need an alias to say which it meant. A name
here says the idea (safeio/atomic.py, sandbox/disks/workspace_reads.py), once.
`__init__.py` is the one name every package has. And no module passes 800 lines, no
function 80 (issue 47): past them a module holds more than one idea, a function more
than one step.

No engine needed. Not here: the import order (test_layers.py), names cited in prose (test_names.py).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 80


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
        f"{name}: {', '.join(paths)}" for name, paths in sorted(shared.items())
    )


def test_the_check_sees_a_shared_name(tmp_path):
    for rel in ("a/__init__.py", "b/__init__.py", "a/files.py", "b/files.py", "a/only.py"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text("")
    assert shared_names(tmp_path) == {"files.py": ["a/files.py", "b/files.py"]}
    assert len(list(PACKAGE.rglob("*.py"))) > 100  # the real check reads the real package


def too_long(root: Path) -> list[str]:
    """Each module of `root` over MAX_MODULE_LINES (its newlines) and each function, nested ones
    too, over MAX_FUNCTION_LINES (its `def` line to its last, decorators not counted)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        src = path.read_text(encoding="utf-8")
        rel = path.relative_to(root).as_posix()
        if (lines := src.count("\n")) > MAX_MODULE_LINES:
            found.append(f"{rel}: {lines} lines")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{rel}:{node.lineno}: {node.name}() is {length} lines")
    return found


def test_no_module_or_function_is_too_long():
    found = too_long(PACKAGE)
    assert not found, (
        f"split by idea: no module over {MAX_MODULE_LINES} lines, no function over {MAX_FUNCTION_LINES}:\n  "
        + "\n  ".join(found)
    )


def test_the_check_sees_a_long_module_and_a_long_function(tmp_path):
    def lines(indent: str, n: int) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(n))

    at_most = MAX_FUNCTION_LINES - 1  # a body that, with its def line, is just long enough
    fits = f"@property\ndef fits():\n{lines('    ', at_most)}"
    (tmp_path / "fits.py").write_text(fits + "\n" * (MAX_MODULE_LINES - fits.count("\n")))
    (tmp_path / "long.py").write_text(f"class C:\n    async def inner(self):\n{lines('        ', at_most + 1)}")
    (tmp_path / "big.py").write_text("\n" * (MAX_MODULE_LINES + 1))
    assert too_long(tmp_path) == [
        f"big.py: {MAX_MODULE_LINES + 1} lines",
        f"long.py:2: inner() is {MAX_FUNCTION_LINES + 1} lines",
    ]
