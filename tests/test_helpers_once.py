"""Each helper is defined once: the tests and the benches share tests/helpers/, they do not copy it.

Read with ast, never imported: every module of tests/ and bench/. Two checks:

- a function or class of tests/helpers/, or a name `tests.helpers` exports
  (REPO), is not defined again at module level elsewhere (a module's own
  knobs, POLL_S or TOKEN, may share a helper module's constant's name);
- no module-level function (a fixture too) has the same parameters and body
  as another anywhere in tests/ or bench/, whatever its name or docstring:
  the second copy belongs in tests/helpers/ (or conftest.py, for a fixture).

No engine needed. Not here: repeated blocks inside functions (the
`duplicates` command shows those; tests/ and bench/ had none of six lines
or more when this was written).
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import tests.helpers
from tests.helpers import REPO

HELPERS = REPO / "tests" / "helpers"
# Module-level names every module may have of its own: not helpers.
OWN = {"__all__", "pytestmark", "main"}
EXPORTED = set(tests.helpers.__all__)


def modules() -> list[Path]:
    return sorted(
        p for folder in ("tests", "bench") for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts
    )


def defined(tree: ast.Module) -> dict[str, ast.stmt]:
    """Module-level names a module defines: functions, classes, assigned names."""
    names: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
    return {name: node for name, node in names.items() if name not in OWN and not name.startswith("__")}


def shape(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """A function as its decorators, parameters and body, without its name and docstring."""
    body = fn.body[1:] if ast.get_docstring(fn) is not None and len(fn.body) > 1 else fn.body
    return "\n".join(ast.dump(part) for part in [*fn.decorator_list, fn.args, *body])


def where(path: Path, node: ast.stmt) -> str:
    return f"{path.relative_to(REPO)}:{node.lineno}"


@functools.cache
def parsed() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in modules()}


def defined_again(trees: dict[Path, ast.Module]) -> list[str]:
    """Names the helpers define that another module defines too."""
    helpers = {
        name: where(path, node)
        for path, tree in trees.items()
        if path.parent == HELPERS
        for name, node in defined(tree).items()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or name in EXPORTED
    }
    return [
        f"{where(path, node)}: {name} (defined in {helpers[name]}; import it from tests.helpers)"
        for path, tree in trees.items()
        if path.parent != HELPERS
        for name, node in defined(tree).items()
        if name in helpers
    ]


def functions_twice(trees: dict[Path, ast.Module]) -> list[str]:
    """Module-level functions with the same shape as another, by place and name."""
    by_shape: dict[str, list[str]] = defaultdict(list)
    for path, tree in trees.items():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                by_shape[shape(node)].append(f"{where(path, node)} {node.name}")
    return [" = ".join(places) for places in by_shape.values() if len(places) > 1]


def test_no_module_defines_a_name_the_helpers_define():
    again = defined_again(parsed())
    assert not again, "helpers defined again:\n  " + "\n  ".join(again)


def test_no_function_is_defined_twice_under_two_names_or_in_two_modules():
    twice = functions_twice(parsed())
    assert not twice, "the same function more than once (share it from tests/helpers/):\n  " + "\n  ".join(twice)


def test_the_checks_see_a_copy():
    """The weakened control: a test module that copies wait_for (as it is, then renamed, with
    another docstring) and sets its own REPO is seen by both checks."""
    support = HELPERS / "support.py"
    source = support.read_text()
    [original] = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "wait_for"]
    copied = ast.get_source_segment(source, original)
    renamed = copied.replace("def wait_for", "def poll_until").replace('"""Poll', '"""Wait: poll')
    module = REPO / "tests" / "test_copy.py"
    trees = {support: ast.parse(source), module: ast.parse(f"REPO = None\n{copied}\n{renamed}\n")}
    assert [line.split(": ", 1)[1].split(" ")[0] for line in defined_again(trees)] == ["REPO", "wait_for"]
    [three] = functions_twice(trees)
    assert three.count("wait_for") == 2 and "poll_until" in three
