"""safeio/shown.py: what a person reads of another's text, every hidden character written out,
and --json that reads back exact (issue 45: a held call must read as it runs)."""

from __future__ import annotations

import json

from orchestrator.records.approvals import Approval
from orchestrator.safeio.shown import json_shown, shown

# bidi overrides and isolates, zero-width space/joiner/non-joiner, word joiner, BOM, soft hyphen,
# a tag character (astral, Cf), a line separator, a no-break space, a Hangul filler, DEL, C1 NEL
HIDING = "\u202a\u202e\u2066\u2067\u2068\u2069\u200b\u200c\u200d\u2060\ufeff\u00ad\U000e0041\u2028\u00a0\u3164\x7f\x85"
HIDDEN_JOINED = "".join(HIDING)


def test_every_hidden_character_is_written_out_and_nothing_else_changes():
    text = "git push origin main" + HIDDEN_JOINED + " é → 日本 😀"
    out = shown(text)
    assert not any(c in out for c in HIDING), out
    assert out.startswith("git push origin main\\u202a\\u202e\\u2066") and "\\U000e0041" in out
    assert out.endswith(" é → 日本 😀")  # what shows itself is left as it is


def test_keep_leaves_the_callers_layout():
    assert shown("a\nb\tc\u2067", keep="\n\t") == "a\nb\tc\\u2067"
    assert shown("a\nb") == "a\\u000ab"


def test_json_reads_back_exact_and_prints_nothing_hidden():
    data = {"call": "ls" + HIDDEN_JOINED, "n": 1, "nested": ["\u202e"]}
    out = json_shown(data)
    assert not any(c in out for c in HIDING), out
    assert json.loads(out) == data  # surrogate pairs for the astral one: still exact


def test_a_held_calls_summary_shows_what_runs():
    call = {"command": "git push\u2067\u2066; echo TROJAN-RAN; :\u2069"}
    a = Approval(id="a1", tool="bash", input=call, rule="tool: bash")
    assert a.summary() == "bash: git push\\u2067\\u2066; echo TROJAN-RAN; :\\u2069"
