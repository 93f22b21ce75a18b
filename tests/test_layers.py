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
process. And the broker decides while the sandbox keeps: broker/ takes from
sandbox/ only the names BROKER_MAY_TAKE_FROM_SANDBOX declares (the keeper,
the types a reply carries, the wire's limits). No engine needed. Not here: whether the module names the docs cite
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
    "orchestrator.sandbox.wake_layer.Settled": "begin's reply",
    "orchestrator.sandbox.wake_layer.WakeChanges": "finish's reply",
    "orchestrator.sandbox.wake_diff.WakeDiff": "diff's reply",
    "orchestrator.sandbox.undo_folders.Undone": "undo's reply",
    "orchestrator.sandbox.undo_folders.UndoRefused": "undo's refusal",
    "orchestrator.sandbox.workspace_reads.HostFiles": "a workspace read on this host",
    # the wire's limits, checked at parse
    "orchestrator.sandbox.workspace_reads.READS": "the reads op read may name",
    "orchestrator.sandbox.workspace_reads.JOURNAL_DIR": "the one folder append may write",
    "orchestrator.sandbox.layers.RUN_ID": "a run id's shape",
    "orchestrator.sandbox.network.MAX_GRANT": "how many hosts a grant may name",
    # a policy question the broker asks before it serves
    "orchestrator.sandbox.network.grant_refusal": "the hosts a person's approval may grant",
    # a moving disk's stream (export, import)
    "orchestrator.sandbox.workspace_stream.Reads": "import's stream",
    "orchestrator.sandbox.workspace_stream.Writes": "export's stream",
    "orchestrator.sandbox.workspace_stream.Summary": "what either end holds",
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
