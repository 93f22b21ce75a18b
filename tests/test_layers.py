"""Imports go down: no package of orchestrator/ imports one above it.

The order (docs/architecture.md §2), bottom first:

    records < policy < sandbox < broker < wake < fleet < views < console < cli

The docs generator (docgen), which reads the policy and the CLI's parser,
sits above cli; views/ above fleet/. escapes/ sits at the top beside
console/ (it attacks every layer, and the console runs it). The leaves (notify/, metrics.py, tracing.py) may be
imported by any layer and import records/ and errors.py at most, so that
every layer can call them. errors.py and assets.py sit under everything and
import nothing of ours; healthcheck.py imports nothing of ours, so compose's
check starts fast. testing/ (stand-ins for the tests) may import anything,
and no module of orchestrator/ imports it.

Every import counts, a lazy one inside a function too: it runs in the same
process. No engine needed. Not here: whether the module names the docs cite
exist (test_names.py).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"

ORDER = ("records", "policy", "sandbox", "broker", "wake", "fleet", "views", "console", "cli", "docgen.py")
BESIDE = {"escapes": "console", "__main__.py": "cli"}  # same rank as the one named
LEAVES = ("notify", "metrics.py", "tracing.py")
LEAF_MAY_IMPORT = ("records", "errors.py")
UNDER_ALL = ("errors.py", "assets.py", "__init__.py")  # import nothing of ours
ALONE = ("healthcheck.py",)  # imports nothing of ours
TEST_ONLY = ("testing", "fakeapi.py")  # may import anything; nothing imports them


def unit(rel: Path) -> str:
    """The package (`sandbox`) or top-level module (`docgen.py`) a file of orchestrator/ belongs to."""
    return rel.parts[0] if len(rel.parts) > 1 else rel.name


@functools.cache  # the package is parsed once for both tests
def imports(root: Path) -> frozenset[tuple[str, str, str]]:
    """(importing file, its unit, imported unit) for every import of orchestrator.* under `root`."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] != "orchestrator" or len(parts) < 2:
                    continue
                target = parts[1] if (root / parts[1]).is_dir() else f"{parts[1]}.py"
                if (root / target).exists() and target != unit(rel):
                    found.add((rel.as_posix(), unit(rel), target))
    return frozenset(found)


def why_not(source: str, target: str) -> str | None:
    """Why `source` may not import `target`, or None when it may."""
    for name in (source, target):
        known = ORDER + tuple(BESIDE) + LEAVES + UNDER_ALL + ALONE + TEST_ONLY
        if name not in known:
            return f"{name} is in no layer: place it in tests/test_layers.py's ORDER (and docs/architecture.md §2)"
    if source in TEST_ONLY:
        return None
    if target in TEST_ONLY:
        return f"{target} is for tests and benches only"
    if source in UNDER_ALL or source in ALONE:
        return f"{source} imports nothing of wakeloop's"
    if target in UNDER_ALL:
        return None
    if source in LEAVES:
        return None if target in LEAF_MAY_IMPORT else f"a leaf imports only {' and '.join(LEAF_MAY_IMPORT)}"
    if target in LEAVES:
        return None
    rank = {name: i for i, name in enumerate(ORDER)}
    rank.update({name: rank[beside] for name, beside in BESIDE.items()})
    if target in ALONE or rank[target] > rank[source]:
        return f"{target} is above {source} ({' < '.join(ORDER)})"
    return None


def wrong_way(root: Path) -> list[str]:
    return sorted(
        f"{path} imports {target}: {reason}"
        for path, source, target in imports(root)
        if (reason := why_not(source, target))
    )


def test_no_package_imports_one_above_it():
    found = wrong_way(PACKAGE)
    assert not found, "imports go down (docs/architecture.md §2):\n  " + "\n  ".join(found)


def test_the_check_sees_an_import_going_up(tmp_path):
    files = {
        "records/__init__.py": "",
        "records/ok.py": "from orchestrator import errors\n",
        "records/up.py": "def late():\n    from orchestrator.policy import schema\n",
        "policy/__init__.py": "",
        "policy/schema.py": "import orchestrator.records.ok\nfrom orchestrator.notify import config\n",
        "notify/__init__.py": "",
        "notify/config.py": "from orchestrator.policy.schema import x\n",
        "errors.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert wrong_way(tmp_path) == [
        "notify/config.py imports policy: a leaf imports only records and errors.py",
        f"records/up.py imports policy: policy is above records ({' < '.join(ORDER)})",
    ]
    assert len(imports(PACKAGE)) > 100  # the real check reads the real package
