"""No module of orchestrator/ takes another's private name (one with a leading underscore).

Taken means imported (`from orchestrator.escapes.broker_probes import _broker`, lazy ones too)
or reached through an imported module (`disk._tool(...)` after `from orchestrator.sandbox
import disk`). A name another module needs is an interface: it is public where it is defined,
or it moves to the module that needs it. A dunder (`__version__`) is not private.

tests/ and bench/ are not checked: a unit test may pin a module's own helper
(`disk._loops`, `notify.channels._message`), and that reaches into the module it tests, not
across the house. Runtime code never does.

No engine needed. Not here: which package may import which (test_layers.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def is_module(root: Path, dotted: str) -> bool:
    path = root.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def taken(root: Path, path: Path) -> list[str]:
    """Each private name `path` takes from another module of ours, as `line: module.name`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules: dict[str, str] = {}  # local name -> a module of ours it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("orchestrator"):
            for alias in node.names:
                whole = f"{node.module}.{alias.name}"
                if is_module(root, whole):
                    modules[alias.asname or alias.name] = whole
                elif private(alias.name):
                    found.append(f"{node.lineno}: {whole}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("orchestrator.") and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and private(node.attr)
        ):
            found.append(f"{node.lineno}: {modules[node.value.id]}.{node.attr}")
    return found


def takers(root: Path) -> list[str]:
    return [
        f"{path.relative_to(root.parent).as_posix()}:{spot}"
        for path in sorted(root.rglob("*.py"))
        for spot in taken(root, path)
    ]


def test_no_module_takes_another_modules_private_name():
    found = takers(PACKAGE)
    assert not found, (
        "a private name taken across modules: make it public where it is defined (it is an "
        "interface), or move it to the module that uses it:\n  " + "\n  ".join(found)
    )


def test_the_check_sees_a_private_name_taken(tmp_path):
    root = tmp_path / "orchestrator"
    files = {
        "__init__.py": "__version__ = '1'\n",
        "a.py": "def _helper(): pass\ndef public(): pass\n",
        "b.py": "from orchestrator.a import public\nfrom orchestrator import __version__\n",
        "c.py": "def late():\n    from orchestrator.a import _helper\n",
        "d.py": "from orchestrator import a\nimport orchestrator.a as al\nx = a._helper() or al._helper() or a.b\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    assert takers(root) == [
        "orchestrator/c.py:2: orchestrator.a._helper",
        "orchestrator/d.py:3: orchestrator.a._helper",
        "orchestrator/d.py:3: orchestrator.a._helper",
    ]
    assert len(takers(PACKAGE)) == 0 and len(list(PACKAGE.rglob("*.py"))) > 100  # the real check reads the real package
