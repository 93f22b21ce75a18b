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

Inside sandbox/, the rooms (containers/, disks/, wakes/, egress/) go down
too: each may import only the rooms its line in docs/architecture.md §2 names;
the interface (box.py, changes.py) imports no room; the modules at the top
(engine.py, rate.py, explain.py, policy_check.py: SANDBOX_TOP) put the rooms
together and may import any.

Every import counts, a lazy one inside a function too: it runs in the same
process. No engine needed. Not here: whether the module names the docs cite
exist (test_names.py).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"

ORDER = ("records", "policy", "sandbox", "broker", "wake", "fleet", "views", "console", "cli.py", "docgen.py")
BESIDE = {"escapes": "console", "__main__.py": "cli.py"}  # same rank as the one named
LEAVES = ("notify", "metrics.py", "tracing.py")
LEAF_MAY_IMPORT = ("records", "errors.py")
UNDER_ALL = ("errors.py", "assets.py", "__init__.py")  # import nothing of ours
ALONE = ("healthcheck.py",)  # imports nothing of ours
TEST_ONLY = ("testing", "fakeapi.py")  # may import anything; nothing imports them


def unit(rel: Path) -> str:
    """The package (`sandbox`) or top-level module (`cli.py`) a file of orchestrator/ belongs to."""
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


SANDBOX_ROOMS = {  # room -> the rooms it may import (docs/architecture.md §2)
    "containers": (),
    "disks": ("containers",),
    "wakes": ("disks", "containers"),
    "egress": ("disks", "containers"),
}
SANDBOX_INTERFACE = ("box.py", "changes.py", "__init__.py")  # every room may import these; they import no room
SANDBOX_TOP = ("engine.py", "keeper.py", "rate.py", "explain.py", "policy_check.py")  # may import every room


def room_of(parts: list[str], sandbox: Path) -> str:
    """The room (`disks`) or top module (`box.py`) of sandbox/ that a dotted name's parts
    after `orchestrator.sandbox` fall in."""
    return parts[0] if (sandbox / parts[0]).is_dir() else f"{parts[0]}.py"


@functools.cache
def sandbox_imports(root: Path) -> frozenset[tuple[str, str, str]]:
    """(importing file, its room, imported room) for every import inside sandbox/, lazy ones too."""
    sandbox, found = root / "sandbox", set()
    for path in sorted(sandbox.rglob("*.py")):
        rel = path.relative_to(sandbox)
        source = rel.parts[0] if len(rel.parts) > 1 else rel.name
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[:2] != ["orchestrator", "sandbox"] or len(parts) < 3:
                    continue
                target = room_of(parts[2:], sandbox)
                if (sandbox / target).exists() and target != source:
                    found.add(((Path("sandbox") / rel).as_posix(), source, target))
    return frozenset(found)


def why_not_in_sandbox(source: str, target: str) -> str | None:
    """Why room (or top module) `source` of sandbox/ may not import `target`, or None when it may."""
    for name in (source, target):
        if name not in (*SANDBOX_ROOMS, *SANDBOX_INTERFACE, *SANDBOX_TOP):
            return f"{name} is in no room of sandbox/: place it in tests/test_layers.py (and docs/architecture.md §2)"
    if source in SANDBOX_TOP or target in SANDBOX_INTERFACE:
        return None
    if source in SANDBOX_INTERFACE:
        return f"the interface ({', '.join(SANDBOX_INTERFACE[:2])}) imports no room"
    if target in SANDBOX_TOP:
        return f"{target} puts the rooms together: no room imports it"
    allowed = SANDBOX_ROOMS[source]
    if target not in allowed:
        if not allowed:
            return f"{source}/ imports no other room"
        return f"{source}/ may import only {', '.join(f'{r}/' for r in allowed)}"
    return None


def wrong_room(root: Path) -> list[str]:
    return sorted(
        f"{path} imports {target}: {reason}"
        for path, source, target in sandbox_imports(root)
        if (reason := why_not_in_sandbox(source, target))
    )


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


def test_each_room_of_the_sandbox_imports_only_the_rooms_below_it():
    found = wrong_room(PACKAGE)
    assert not found, "sandbox/'s rooms import down (docs/architecture.md §2):\n  " + "\n  ".join(found)


def test_the_check_sees_a_room_importing_one_it_may_not(tmp_path):
    files = {
        "sandbox/__init__.py": "",
        "sandbox/box.py": "from orchestrator.sandbox.disks import disk\n",
        "sandbox/engine.py": "from orchestrator.sandbox.egress import network\nfrom orchestrator.sandbox import box\n",
        "sandbox/containers/__init__.py": "",
        "sandbox/containers/pool.py": "def late():\n    from orchestrator.sandbox.disks import disk\n",
        "sandbox/disks/__init__.py": "",
        "sandbox/disks/disk.py": (
            "from orchestrator.sandbox.containers import output\nimport orchestrator.sandbox.engine\n"
        ),
        "sandbox/egress/__init__.py": "",
        "sandbox/egress/network.py": "from orchestrator.sandbox.disks.disk import Disk\n",
        "sandbox/loose.py": "",
        "sandbox/wakes/__init__.py": "",
        "sandbox/wakes/wake_layer.py": "from orchestrator.sandbox import loose\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert wrong_room(tmp_path) == [
        "sandbox/box.py imports disks: the interface (box.py, changes.py) imports no room",
        "sandbox/containers/pool.py imports disks: containers/ imports no other room",
        "sandbox/disks/disk.py imports engine.py: engine.py puts the rooms together: no room imports it",
        "sandbox/wakes/wake_layer.py imports loose.py: loose.py is in no room of sandbox/: "
        "place it in tests/test_layers.py (and docs/architecture.md §2)",
    ]
    assert len(sandbox_imports(PACKAGE)) > 20  # the real check reads the real rooms
