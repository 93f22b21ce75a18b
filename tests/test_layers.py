"""Imports go down: no package of orchestrator/ imports one above it, none imports another that
imports it back, and no module imports itself round a circle.

The order (docs/architecture.md §2), bottom first:

    safeio < records < policy < sandbox < broker < wake < fleet < views < console < escapes < cli

The docs generator (docgen), which reads the policy and the CLI's parser,
sits above cli; views/ above fleet/. escapes/ sits above console/ (it attacks
every layer, a real console too; the console runs it as a child process and
reads its reports from records/escape_reports.py). The leaves (notify/,
metrics.py, tracing.py) may be imported by any layer and import safeio/,
records/ and errors.py at most, so that every layer can call them. errors.py
and assets.py sit under everything and import nothing of ours;
healthcheck.py imports nothing of ours, so compose's check starts fast.
testing/ (stand-ins for the tests) may import anything, and no module of
orchestrator/ imports it.

Inside sandbox/, the rooms (containers/, disks/, wakes/, egress/) go down
too: each may import only the rooms its line in docs/architecture.md §2 names;
the interface (box.py, change_set.py) imports no room; the modules at the top
(engine.py, rate.py, explain.py, policy_check.py, keeper.py: SANDBOX_TOP) put the rooms
together and may import any.

Every import counts, a lazy one inside a function and one under
`if TYPE_CHECKING:` too: a lazy one runs in the same process, and both say
that one module needs the other, so a circle made of them is still a circle
(it only moves the failure from import time to the first call). A circle is
counted between modules as the import statements name them (`from
orchestrator.sandbox import disk` names sandbox/disks/disk.py; `from
orchestrator.escapes import ALL_PROBES` names escapes/__init__.py); that
importing a module first runs its package's __init__.py is not counted, or
every module would make a circle with its own package.

And the broker decides while the sandbox keeps: broker/ takes from
sandbox/ only the names BROKER_MAY_TAKE_FROM_SANDBOX declares (the keeper,
the types a reply carries, the wire's limits).

No engine needed. Not here: whether the module names the docs cite exist
(test_names.py), private names taken across modules (test_private_names.py).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"

ORDER = (
    "safeio",
    "records",
    "policy",
    "sandbox",
    "broker",
    "wake",
    "fleet",
    "views",
    "console",
    "escapes",
    "cli",
    "docgen.py",
)
BESIDE = {"__main__.py": "cli"}  # same rank as the one named
LEAVES = ("notify", "metrics.py", "tracing.py")
LEAF_MAY_IMPORT = ("safeio", "records", "errors.py")
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


SANDBOX_ROOMS = {  # room -> the rooms it may import (docs/architecture.md §2)
    "containers": (),
    "disks": ("containers",),
    "wakes": ("disks", "containers"),
    "egress": ("disks", "containers"),
}
SANDBOX_INTERFACE = ("box.py", "change_set.py", "__init__.py")  # every room may import these; they import no room
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
        "notify/config.py imports policy: a leaf imports only safeio and records and errors.py",
        f"records/up.py imports policy: policy is above records ({' < '.join(ORDER)})",
    ]
    assert len(imports(PACKAGE)) > 100  # the real check reads the real package


def both_ways(root: Path) -> list[str]:
    """Each pair of units (packages, top-level modules) that import each other, with the files."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path, source, target in imports(root):
        edges.setdefault((source, target), []).append(path)
    return sorted(
        f"{a} <-> {b}: {', '.join(sorted(edges[a, b]))} | {', '.join(sorted(edges[b, a]))}"
        for a, b in edges
        if a < b and (b, a) in edges
    )


def test_no_two_packages_import_each_other():
    found = both_ways(PACKAGE)
    assert not found, "two packages import each other: move what both need below both:\n  " + "\n  ".join(found)


def module_name(root: Path, path: Path) -> str:
    parts = ["orchestrator", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def module_graph(root: Path) -> dict[str, frozenset[str]]:
    """Module -> the modules of ours it names in an import, anywhere in it (lazy, TYPE_CHECKING)."""
    paths = {module_name(root, path): path for path in sorted(root.rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        named = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                named |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    whole = f"{node.module}.{alias.name}"
                    named.add(whole if whole in paths else node.module)
        graph[name] = frozenset(n for n in named if n in paths and n != name)
    return graph


def circles(graph: dict[str, frozenset[str]]) -> list[frozenset[str]]:
    """The strongly connected sets of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, rest = work[-1]
            step = next(rest, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    member = stack.pop()
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(frozenset(members))
    return found


def test_no_module_imports_itself_round_a_circle():
    found = sorted(" -> ".join(sorted(c)) for c in circles(module_graph(PACKAGE)))
    assert not found, "modules that import each other round a circle:\n  " + "\n  ".join(found)


def test_the_checks_see_two_packages_and_a_circle(tmp_path):
    files = {
        "records/__init__.py": "",
        "records/a.py": "from orchestrator.records import b\n",
        "records/b.py": "def late():\n    from orchestrator.records.c import x\n",
        "records/c.py": "import typing\nif typing.TYPE_CHECKING:\n    from orchestrator.records.a import y\n",
        "policy/__init__.py": "",
        "policy/p.py": "from orchestrator.records import a\n",
        "notify/__init__.py": "",
        "notify/n.py": "from orchestrator.policy import p\n",
        "policy/q.py": "from orchestrator.notify.n import z\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert both_ways(tmp_path) == ["notify <-> policy: notify/n.py | policy/q.py"]
    assert circles(module_graph(tmp_path)) == [
        frozenset({"orchestrator.records.a", "orchestrator.records.b", "orchestrator.records.c"})
    ]  # a lazy import and one under TYPE_CHECKING close it; q -> n -> p -> a is no circle


# -- the broker decides, the sandbox keeps: what broker/ may take from sandbox/ -----------------

# Each name of sandbox/ a module of broker/ may use (imported, or read off an imported module),
# and why. The broker asks the keeper; the rest are the types a reply carries and the wire's
# limits. A name not here is the broker doing the sandbox's work: give it to the keeper.
BROKER_MAY_TAKE_FROM_SANDBOX = {
    # the one interface the broker asks (sandbox/keeper.py), and this host's without a broker
    "orchestrator.sandbox.keeper.Keeper": "each agent's kept box, disk, egress and wake",
    "orchestrator.sandbox.keeper.Refused": "what it will not do as things stand: the broker's refusal",
    "orchestrator.sandbox.keeper.Call": "a call the broker allowed, made on the kept box",
    "orchestrator.sandbox.keeper.own_container_id": "plain_container.py: which container it runs in",
    "orchestrator.sandbox.keeper.open_here": "client.py: a box on this host",
    "orchestrator.sandbox.keeper.diff_here": "client.py: a wake's diff on this host",
    "orchestrator.sandbox.keeper.undo_here": "client.py: an undo on this host",
    # a box: what it is, what it answers, how it fails
    "orchestrator.sandbox.box.Sandbox": "what open_sandbox returns",
    "orchestrator.sandbox.box.SandboxResult": "a call's reply",
    "orchestrator.sandbox.box.SandboxError": "a box that failed (refused: false)",
    # a wake's results, as replies carry them
    "orchestrator.sandbox.change_set.Settled": "begin's reply",
    "orchestrator.sandbox.change_set.WakeChanges": "finish's reply",
    "orchestrator.sandbox.wakes.wake_diff.WakeDiff": "diff's reply",
    "orchestrator.sandbox.wakes.undo_folders.Undone": "undo's reply",
    "orchestrator.sandbox.wakes.undo_folders.UndoRefused": "undo's refusal",
    "orchestrator.sandbox.disks.workspace_reads.HostFiles": "a workspace read on this host",
    # the wire's limits, checked at parse
    "orchestrator.sandbox.disks.workspace_reads.READS": "the reads op read may name",
    "orchestrator.sandbox.disks.workspace_reads.JOURNAL_DIR": "the one folder append may write",
    "orchestrator.sandbox.disks.layers.RUN_ID": "a run id's shape",
    "orchestrator.sandbox.egress.egress_plan.MAX_GRANT": "how many hosts a grant may name",
    # a policy question the broker asks before it serves
    "orchestrator.sandbox.egress.egress_plan.grant_refusal": "the hosts a person's approval may grant",
    # a moving disk's stream (export, import)
    "orchestrator.sandbox.disks.workspace_stream.Reads": "import's stream",
    "orchestrator.sandbox.disks.workspace_stream.Writes": "export's stream",
    "orchestrator.sandbox.disks.workspace_stream.Summary": "what either end holds",
}


def sandbox_names(path: Path) -> set[str]:
    """The names of orchestrator.sandbox a file uses: each imported name, and each attribute read
    off an imported sandbox module (as /work/brief's crossings count counts them)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found, modules = set(), {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("orchestrator.sandbox")
        ):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full)
                modules[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("orchestrator.sandbox"):
                    modules[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            base = modules[node.value.id]
            if base.rsplit(".", 1)[-1][:1].islower():  # a module, not a class
                found.discard(base)
                found.add(f"{base}.{node.attr}")
    return found


def test_the_broker_takes_from_the_sandbox_only_the_declared_names():
    taken: dict[str, list[str]] = {}  # name -> the files of broker/ that take it
    for path in sorted((PACKAGE / "broker").rglob("*.py")):
        for name in sandbox_names(path):
            taken.setdefault(name, []).append(path.name)
    undeclared = sorted(f"{n} ({', '.join(f)})" for n, f in taken.items() if n not in BROKER_MAY_TAKE_FROM_SANDBOX)
    assert not undeclared, (
        "broker/ decides, sandbox/ keeps: ask the keeper (sandbox/keeper.py) rather than take these "
        "from sandbox/, or declare each in BROKER_MAY_TAKE_FROM_SANDBOX with why:\n  " + "\n  ".join(undeclared)
    )
    unused = sorted(set(BROKER_MAY_TAKE_FROM_SANDBOX) - set(taken))
    assert not unused, f"declared, but broker/ no longer takes them: drop them from the list: {unused}"
    crossings = sum(len(files) for files in taken.values())
    assert crossings <= 33, (
        f"broker/ takes {crossings} names from sandbox/, file by file (67 before the keeper, 33 after)"
    )


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
        "sandbox/box.py imports disks: the interface (box.py, change_set.py) imports no room",
        "sandbox/containers/pool.py imports disks: containers/ imports no other room",
        "sandbox/disks/disk.py imports engine.py: engine.py puts the rooms together: no room imports it",
        "sandbox/wakes/wake_layer.py imports loose.py: loose.py is in no room of sandbox/: "
        "place it in tests/test_layers.py (and docs/architecture.md §2)",
    ]
    assert len(sandbox_imports(PACKAGE)) > 20  # the real check reads the real rooms
