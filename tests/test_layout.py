"""The package's layout stays findable: no two modules share a name.

Two modules called `files` (one writing state/, one reading the workspace) made a reader
open the wrong one and an import need an alias to say which it meant. A name
here says the idea (records/atomic.py, sandbox/disks/workspace_reads.py), once.
`__init__.py` is the one name every package has.

No engine needed. Not here: the import order (test_layers.py), names cited in prose (test_names.py).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"


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
