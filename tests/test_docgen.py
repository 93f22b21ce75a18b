"""The reference pages say what the code says: docs/policy.md, docs/cli.md, docs/security.md, README.md.

docs/policy.md and docs/cli.md each hold one block that orchestrator/docgen.py
prints from the policy's dataclasses and from the CLI's parser (cli/wakeloop.py); a field, a
comment, a bound or a flag changed without `python -m orchestrator.docgen
--write` fails here. The threat table of docs/security.md names every probe of
the escape suite (or its category), and the README still opens with the two
commands a newcomer needs.

No engine needed. Not here: whether a file named in prose exists (test_names.py).
"""

from __future__ import annotations

import re

from orchestrator import docgen
from orchestrator.escapes import ALL_PROBES, CATEGORIES
from tests.helpers import REPO

FIX = "run `python -m orchestrator.docgen --write` and commit the pages"


def _page(rel: str) -> str:
    return (REPO / rel).read_text(encoding="utf-8")


def test_the_policy_reference_is_what_the_schema_says():
    assert docgen.block_of("policy", _page("docs/policy.md")) == docgen.policy_block(), FIX


def test_the_cli_reference_is_what_the_parser_says():
    assert docgen.block_of("cli", _page("docs/cli.md")) == docgen.cli_block(), FIX


def test_the_script_example_in_the_cli_reference_is_what_a_dry_run_plays(tmp_path):
    from orchestrator.wake.model import ScriptedModel, load_script

    wake = _page("docs/cli.md").split("### `wakeloop wake`")[1].split("### ")[0]
    assert "--script FILE: the dry run's model, scripted" in wake
    example = wake[wake.index("```\n  [") + 4 :].split("\n```")[0]  # the fenced JSON list
    (tmp_path / "script.json").write_text(example)
    model = ScriptedModel(load_script(tmp_path / "script.json"), variables={"wake": 7, "today": "2026-12-07"})
    tools = [{"name": "bash"}, {"name": "write_file"}]
    played = [model.call(system="", tools=tools, messages=[], max_tokens=1) for _ in range(4)]
    assert [t.stop_reason for t in played] == ["tool_use", "tool_use", "end_turn", "end_turn"]
    (write,) = [b for b in played[1].content if b["type"] == "tool_use"]
    assert write["name"] == "write_file" and write["input"] == {"path": "notes/2026-12-07.md", "content": "wake 7\n"}
    assert played[3].content[0]["text"] == "(end of script)"


def test_every_policy_key_has_a_row_that_says_what_it_means():
    # A key with no comment in the schema would be a row with an empty last cell: say why it is there.
    block = docgen.policy_block()
    sections = dict(re.findall(r"^### `([^`]+)`\n(.*?)(?=^### |\Z)", block, re.MULTILINE | re.DOTALL))
    keys = docgen.policy_keys()
    assert len(keys) >= 50 and "tools.bash.timeout_s" in keys and "approve.rules[].tool" in keys
    for key in keys:
        section, _, name = key.rpartition(".")
        rows = re.findall(
            rf"^\| `{re.escape(name)}` \|.*\| ([^|]*) \|$", sections[section or "(top level)"], re.MULTILINE
        )
        assert rows and rows[0].strip(), f"{key}: no row, or no meaning (a comment on its line in the schema)"


def test_a_stale_block_is_caught_and_rewritten():
    page = _page("docs/policy.md").replace("| `max_steps` | `int` | `40` |", "| `max_steps` | `int` | `41` |")
    assert docgen.block_of("policy", page) != docgen.policy_block()
    assert docgen.block_of("policy", docgen.rewrite("policy", page)) == docgen.policy_block()
    assert docgen.block_of("policy", "no markers here") is None


def test_the_threat_table_names_every_probe():
    # Each probe by name, or its category by name (`surfaces` is a ring of different promises: by name only).
    text = _page("docs/security.md")
    table = text[text.index("## Threat model") : text.index("## Known gaps")]
    named = set(re.findall(r"`([a-z0-9_]+)`", table))
    probes = {p.name for p in ALL_PROBES}
    unknown = sorted(n for n in named if "_" in n and n not in probes and n not in CATEGORIES)
    assert not unknown, f"the threat table names probes that do not exist: {unknown}"
    unproven = [
        p.name for p in ALL_PROBES if p.name not in named and (p.category == "surfaces" or p.category not in named)
    ]
    assert not unproven, f"probes the threat table of docs/security.md does not name: {unproven}"


def test_the_readme_opens_with_the_two_commands():
    first = _page("README.md").split("```")[1]
    assert re.search(r"^docker compose up\s+# .*no API key", first, re.MULTILINE)
    assert re.search(r"^\./scripts/test\.sh\s+# the whole test suite", first, re.MULTILINE)
