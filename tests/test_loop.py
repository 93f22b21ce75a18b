"""The wake loop end to end: the real anthropic SDK against testing/fakeapi.py, real tools in real containers.

Each test scripts the model's replies at the wire and asserts on what the
harness sent back (request bodies), what it did (workspace, state/, events)
and what it reported (the receipt, the exit code).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from orchestrator.records.event_types import ModelResponse
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.records.state import read_outbox, send_message_to_agent
from orchestrator.testing.fakeapi import FAKE_KEY, FakeAPI, api_error, text, tool_use, turn, usage
from orchestrator.wake.model import MAX_RETRIES
from tests.helpers import live_wake, run_cli, set_policy, today
from tests.helpers.recorded import result_text, tool_results

KEY = FAKE_KEY


def events_of(agent_dir: Path) -> list:
    return list(read_events(agent_dir / "state" / EVENTS_FILE))


def types_of(agent_dir: Path) -> list[str]:
    return [e.type for e in events_of(agent_dir)]


def last_receipt(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


# -- a normal wake ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
def test_normal_wake_uses_all_three_tools(agent_dir, fake_api, stream, disk_view):
    day = today()
    api = fake_api(
        [
            turn(text("Looking around."), tool_use("bash", {"command": "echo hello > notes.txt; cat notes.txt"})),
            turn(tool_use("write_file", {"path": f"memory/journal/{day}.md", "content": "## Wake\nWrote notes.\n"})),
            turn(tool_use("send_message", {"text": "Hello, human: notes.txt is ready."})),
            turn(text("All done for this wake.")),
        ]
    )
    send_message_to_agent(agent_dir / "state", "please write notes")
    receipt = live_wake(agent_dir, stream=stream)

    assert (receipt.status, receipt.reason, receipt.steps, receipt.tool_calls) == ("done", "end_turn", 4, 3)
    assert len(api.requests) == 4
    assert "please write notes" in api.requests[0].body["messages"][0]["content"][0]["text"]
    assert bool(api.requests[0].body.get("stream")) is stream
    assert (disk_view(agent_dir) / "notes.txt").read_text() == "hello\n"
    assert "hello" in result_text(tool_results(api.requests[1])[0])
    assert "wrote" in result_text(tool_results(api.requests[2])[0])
    assert "Hello, human" in read_outbox(agent_dir / "state")
    assert not (disk_view(agent_dir) / "outbox.txt").exists()
    assert receipt.journal == "agent"  # the agent journaled: no stub
    assert "harness stub" not in (disk_view(agent_dir) / f"memory/journal/{day}.md").read_text()
    assert not (agent_dir / "state/inbox.txt").exists() and not (agent_dir / "state/inbox.taken").exists()
    kinds = types_of(agent_dir)
    for kind in ("wake_started", "model_request", "model_response", "tool_call", "tool_result", "wake_finished"):
        assert kind in kinds
    assert kinds.count("tool_call") == 3 and kinds[-1] == "wake_finished"
    state = json.loads((agent_dir / "state/state.json").read_text())
    assert state["wake"] == 1 and state["tokens_lifetime"] == receipt.tokens > 0
    assert not (agent_dir / "state/wake.lock").exists()


def test_model_that_never_stops_ends_at_max_steps_with_a_stub(agent_dir, fake_api, disk_view):
    set_policy(agent_dir, {"budget": {"max_steps": 3}})
    api = fake_api(then=lambda rec: turn(tool_use("bash", {"command": "true"})))
    receipt = live_wake(agent_dir)

    assert receipt.status == "budget_stop" and "max_steps" in receipt.reason
    assert receipt.steps == 3 and len(api.requests) == 3
    journal = (disk_view(agent_dir) / f"memory/journal/{today()}.md").read_text()
    assert "harness stub" in journal and "Steps: 3" in journal and "max_steps" in journal
    kinds = types_of(agent_dir)
    assert "budget_stop" in kinds and "journal_stub" in kinds


def test_token_budget_trip_gets_exactly_one_final_request_whose_tools_do_not_run(agent_dir, fake_api, disk_view):
    set_policy(agent_dir, {"budget": {"max_tokens_per_wake": 1000}})
    api = fake_api(
        [
            turn(tool_use("bash", {"command": "echo one"}), usage=usage(400, 100)),
            turn(tool_use("bash", {"command": "echo two"}), usage=usage(300, 50, cache_read=200)),  # 1050
            # The final reply even tries a tool: told none will run, it must not run.
            turn(
                text("Journal: ran echo one and two; next, read the docs."),
                tool_use("bash", {"command": "echo SHOULD-NOT-RUN > x"}),
                usage=usage(100, 20),
            ),
        ],
        then=turn(text("no request should get here")),
    )
    receipt = live_wake(agent_dir)

    assert len(api.requests) == 3
    final = api.requests[2].body
    # tools and tool_choice as before: a changed tool_choice re-writes the cached messages on 5.x
    assert final.get("tool_choice") == api.requests[0].body.get("tool_choice")
    assert [t["name"] for t in final["tools"]] == [t["name"] for t in api.requests[0].body["tools"]]
    assert "two" in result_text(tool_results(api.requests[2])[0])  # the tripping turn's tool ran and was answered
    note = final["messages"][-1]["content"][-1]
    assert note["type"] == "text" and "token budget" in note["text"] and "journal" in note["text"]
    assert "no more tools" in note["text"]
    assert receipt.status == "budget_stop" and "max_tokens_per_wake" in receipt.reason
    assert receipt.tokens == 400 + 100 + 300 + 50 + 200 + 100 + 20
    assert receipt.tool_calls == 2 and not (disk_view(agent_dir) / "x").exists()
    journal = (disk_view(agent_dir) / f"memory/journal/{today()}.md").read_text()
    assert "ran echo one and two" in journal and "closing note" in journal
    assert types_of(agent_dir).count("budget_stop") == 1


# -- the API failing -------------------------------------------------------------------


def test_529_then_success_is_retried(agent_dir, fake_api):
    api = fake_api([api_error(529), turn(text("fine now"))])
    receipt = live_wake(agent_dir)
    assert receipt.status == "done" and receipt.steps == 1
    assert len(api.requests) == 2
    assert api.requests[1].headers.get("x-stainless-retry-count") == "1"


def test_529_forever_is_a_dead_letter_exit_1_lock_free_inbox_kept(agent_dir, disk_view):
    send_message_to_agent(agent_dir / "state", "a message that must not be lost")
    with FakeAPI(then=api_error(529)) as api:
        proc = run_cli("wake", str(agent_dir), "--live", env={"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": KEY})
    assert proc.returncode == 1, proc.stderr
    receipt = last_receipt(proc.stdout)
    assert receipt["status"] == "dead_letter" and "529" in receipt["reason"]
    assert len(api.requests) == 1 + MAX_RETRIES
    assert not (agent_dir / "state/wake.lock").exists()
    assert "a message that must not be lost" in (agent_dir / "state/inbox.txt").read_text()
    assert "harness stub" in (disk_view(agent_dir) / f"memory/journal/{today()}.md").read_text()
    dead = [e for e in events_of(agent_dir) if e.type == "dead_letter"]
    assert len(dead) == 1 and "overloaded" in dead[0].data["reason"]


def test_no_api_key_in_live_mode_is_one_line_exit_2_nothing_touched(agent_dir):
    before = sorted(p.name for p in (agent_dir / "state").iterdir())
    proc = run_cli("wake", str(agent_dir), "--live")
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert "ANTHROPIC_API_KEY" in proc.stderr
    assert sorted(p.name for p in (agent_dir / "state").iterdir()) == before


# -- bad tool calls -----------------------------------------------------------------------


def test_malformed_tool_input_is_an_error_result_not_a_crash(agent_dir, fake_api):
    api = fake_api(
        [
            turn(
                tool_use("bash", {"cmd": "ls"}),  # wrong argument name
                tool_use("write_file", {"path": 5, "content": "x"}),  # wrong type
                tool_use("bash", "ls -la"),  # not an object at all
                tool_use("write_file", {"path": "a.txt"}),
            ),  # missing argument
            turn(text("ok, giving up")),
        ]
    )
    receipt = live_wake(agent_dir, stream=False)
    results = tool_results(api.requests[1])
    assert len(results) == 4 and all(r.get("is_error") for r in results)
    assert "missing argument 'command', unexpected argument 'cmd'" in result_text(results[0])
    assert "must be a string" in result_text(results[1])
    assert "JSON object" in result_text(results[2])
    assert "missing argument 'content'" in result_text(results[3])
    assert receipt.status == "done" and receipt.steps == 2


def test_unknown_tool_is_an_error_result(agent_dir, fake_api):
    api = fake_api([turn(tool_use("launch_missiles", {"target": "moon"})), turn(text("sorry"))])
    receipt = live_wake(agent_dir)
    (result,) = tool_results(api.requests[1])
    assert result.get("is_error") and "unknown tool 'launch_missiles'" in result_text(result)
    assert receipt.status == "done"


def test_three_tool_use_blocks_in_one_turn_all_run_and_answer_in_order(agent_dir, fake_api, disk_view):
    calls = [tool_use("bash", {"command": f"echo out-{n} >> order.txt; echo out-{n}"}) for n in (1, 2, 3)]
    api = fake_api([turn(text("three at once"), *calls), turn(text("done"))])
    receipt = live_wake(agent_dir)
    results = tool_results(api.requests[1])
    assert [r["tool_use_id"] for r in results] == [c["id"] for c in calls]
    assert [result_text(r).splitlines()[-1] for r in results] == ["out-1", "out-2", "out-3"]
    assert (disk_view(agent_dir) / "order.txt").read_text() == "out-1\nout-2\nout-3\n"
    assert receipt.tool_calls == 3


def test_disabled_tool_is_not_offered_and_a_call_is_refused(agent_dir, fake_api, disk_view):
    set_policy(agent_dir, {"tools": {"bash": {"enabled": False}, "send_message": {"max_per_wake": 1}}})
    api = fake_api(
        [
            turn(
                tool_use("bash", {"command": "touch pwned"}),
                tool_use("send_message", {"text": "first"}),
                tool_use("send_message", {"text": "second"}),
            ),
            turn(text("ok")),
        ]
    )
    live_wake(agent_dir)
    assert [t["name"] for t in api.requests[0].body["tools"]] == [
        "write_file",
        "send_message",
        "str_replace_based_edit_tool",
    ]
    bash, first, second = tool_results(api.requests[1])
    assert bash.get("is_error") and "disabled" in result_text(bash)
    assert not first.get("is_error") and second.get("is_error") and "max_per_wake" in result_text(second)
    assert not (disk_view(agent_dir) / "pwned").exists()
    assert "first" in read_outbox(agent_dir / "state") and "second" not in read_outbox(agent_dir / "state")
    denied = [e.data for e in events_of(agent_dir) if e.type == "policy_denied"]
    assert [d["tool"] for d in denied] == ["bash", "send_message"]


def test_a_long_send_message_is_cut_to_max_chars_and_the_model_is_told(agent_dir, fake_api):
    # 40,000 characters: the fake API counts them as output tokens, and a 1 MiB reply would
    # spend the wake's budget (the 1 MiB case: surfaces/records.py's probe, on the tool itself).
    set_policy(agent_dir, {"tools": {"send_message": {"max_chars": 1000}}})
    api = fake_api([turn(tool_use("send_message", {"text": "A" * 999 + "B" + "C" * 39_000})), turn(text("ok"))])
    live_wake(agent_dir, stream=False)
    (result,) = tool_results(api.requests[1])
    told = result_text(result)
    assert not result.get("is_error") and "cut" in told and "39,000" in told and "max_chars" in told
    outbox = read_outbox(agent_dir / "state")
    assert "A" * 999 + "B" in outbox and "C" not in outbox
    assert (agent_dir / "state" / "outbox.txt").stat().st_size < 1200
    sent = [e.data for e in events_of(agent_dir) if e.type == "tool_call" and e.data.get("tool") == "send_message"]
    assert sent and all(len(json.dumps(d)) < 4000 for d in sent)  # the event log keeps an abbreviation


def test_write_file_deny_glob_is_refused_and_logged(agent_dir, fake_api, disk_view):
    set_policy(agent_dir, {"tools": {"write_file": {"deny": ["secrets/**"]}}})
    api = fake_api([turn(tool_use("write_file", {"path": "secrets/x.txt", "content": "x"})), turn(text("ok"))])
    live_wake(agent_dir)
    (result,) = tool_results(api.requests[1])
    assert result.get("is_error") and "REFUSED" in result_text(result)
    assert not (disk_view(agent_dir) / "secrets").exists()
    assert "policy_denied" in types_of(agent_dir)


# -- the key never leaks --------------------------------------------------------------------


def test_api_key_never_reaches_sandbox_events_or_request_bodies(agent_dir, fake_api, disk_view):
    api = fake_api(
        [
            turn(
                tool_use(
                    "bash",
                    {
                        "command": "env; cat /proc/1/environ | tr '\\0' '\\n'; "
                        "grep -rs sk-ant /workspace /tmp /etc /root 2>/dev/null | head -3; "
                        "echo probed"
                    },
                )
            ),
            turn(tool_use("send_message", {"text": "done probing"})),
            turn(text("bye")),
        ]
    )
    receipt = live_wake(agent_dir)
    assert receipt.status == "done"
    sent = api.requests[0].headers
    assert KEY in (sent.get("x-api-key", "") + sent.get("authorization", ""))  # the canary is the key in use...
    probe = result_text(tool_results(api.requests[1])[0])
    assert "probed" in probe and "PATH=" in probe  # ...the probe really ran...
    for rec in api.requests:  # ...and the key is nowhere else
        assert KEY.encode() not in rec.raw
    assert KEY not in (agent_dir / "state" / EVENTS_FILE).read_text()
    for path in [*disk_view(agent_dir).rglob("*"), *(agent_dir / "state").rglob("*")]:  # transcripts too
        if path.is_file():
            assert KEY not in path.read_text(errors="replace")
    assert KEY not in receipt.to_json()


# -- prompt caching ----------------------------------------------------------------------------


def test_steps_2_to_n_read_the_stable_prefix_from_cache(agent_dir, fake_api):
    api = fake_api([turn(tool_use("bash", {"command": f"echo step {n}"})) for n in range(1, 4)] + [turn(text("done"))])
    receipt = live_wake(agent_dir)
    bodies = [r.body for r in api.requests]
    assert len(bodies) == 4
    # the prefix is byte-identical from step to step
    assert all(json.dumps(b["tools"]) == json.dumps(bodies[0]["tools"]) for b in bodies)
    assert all(json.dumps(b["system"]) == json.dumps(bodies[0]["system"]) for b in bodies)
    assert bodies[0]["system"][-1]["cache_control"] == {"type": "ephemeral"}
    for b in bodies:  # the moving breakpoint: the last block of the last message, and at most 4 in all
        assert b["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
        assert json.dumps(b).count('"cache_control"') == 2
    responses = [e.record.usage for e in events_of(agent_dir) if isinstance(e.record, ModelResponse)]
    assert responses[0].cache_read_tokens == 0 and responses[0].cache_write_tokens > 0
    for n, u in enumerate(responses[1:], 2):  # each later step reads everything before it from cache
        assert u.cache_read_tokens > responses[n - 2].cache_read_tokens, n
    assert receipt.usage.cache_read_tokens == sum(u.cache_read_tokens for u in responses) > 0
    assert receipt.usage.cache_write_tokens == sum(u.cache_write_tokens for u in responses)
    assert receipt.tokens == sum(responses).tokens


# -- stop reasons ---------------------------------------------------------------------------------


def test_pause_turn_sends_the_assistant_turn_back_and_continues(agent_dir, fake_api):
    paused = [text("Thinking about a long search...")]
    api = fake_api([turn(*paused, stop_reason="pause_turn"), turn(text("finished"))])
    receipt = live_wake(agent_dir)
    assert receipt.status == "done" and len(api.requests) == 2
    last = api.requests[1].body["messages"][-1]
    assert last["role"] == "assistant" and last["content"] == paused


def test_max_tokens_without_tools_asks_to_continue(agent_dir, fake_api):
    api = fake_api([turn(text("A very long answer that got cu"), stop_reason="max_tokens"), turn(text("t. Done."))])
    receipt = live_wake(agent_dir)
    assert receipt.status == "done" and len(api.requests) == 2
    assert "cut at the output limit" in api.requests[1].body["messages"][-1]["content"][-1]["text"]


def test_max_tokens_with_a_complete_tool_use_runs_it(agent_dir, fake_api):
    api = fake_api([turn(tool_use("bash", {"command": "echo ran"}), stop_reason="max_tokens"), turn(text("ok"))])
    live_wake(agent_dir)
    assert "ran" in result_text(tool_results(api.requests[1])[0])


@pytest.mark.parametrize("stop_reason", ["refusal", "model_context_window_exceeded", "something_new"])
def test_refusal_and_unknown_stop_reasons_are_dead_letters(agent_dir, fake_api, stop_reason, disk_view):
    fake_api([turn(text("..."), stop_reason=stop_reason)])
    receipt = live_wake(agent_dir)
    assert receipt.status == "dead_letter" and stop_reason in receipt.reason
    assert "dead_letter" in types_of(agent_dir)
    assert "harness stub" in (disk_view(agent_dir) / f"memory/journal/{today()}.md").read_text()


def test_stop_event_ends_at_the_next_step_boundary(agent_dir, fake_api, disk_view):
    stop = threading.Event()

    def second(rec):
        stop.set()  # as a scheduler's SIGTERM handler would, mid-wake
        return turn(tool_use("bash", {"command": "echo a"}), tool_use("bash", {"command": "echo b > b.txt"}))

    api = fake_api([turn(tool_use("bash", {"command": "true"})), second], then=turn(text("no request should get here")))
    receipt = live_wake(agent_dir, stop=stop)
    assert (receipt.status, receipt.reason) == ("done", "stopped")
    assert len(api.requests) == 2 and receipt.tool_calls == 1
    assert not (disk_view(agent_dir) / "b.txt").exists()
    assert "harness stub" in (disk_view(agent_dir) / f"memory/journal/{today()}.md").read_text()
    assert not (agent_dir / "state/wake.lock").exists()


# -- dry run and the CLI ---------------------------------------------------------------------------


def test_dry_run_cli_drives_real_tools_without_any_api(agent_dir, disk_view):
    proc = run_cli("wake", str(agent_dir), env={"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"})
    assert proc.returncode == 0, proc.stderr
    receipt = last_receipt(proc.stdout)
    assert receipt["status"] == "done" and not receipt["live"] and receipt["tool_calls"] == 4
    assert receipt["journal"] == "agent"
    assert "- Last dry run: wake #1" in (disk_view(agent_dir) / "memory/core.md").read_text()
    assert "(empty: this is the first wake)" in (disk_view(agent_dir) / "memory/core.md").read_text()
    assert "Wake #1 (dry run)" in (disk_view(agent_dir) / f"memory/journal/{today()}.md").read_text()
    assert (disk_view(agent_dir) / "memory/dry-run.md").is_file()
    assert "step 1" in proc.stderr  # progress on stderr: stdout is the receipt alone
    assert len(proc.stdout.strip().splitlines()) == 1


def test_script_file_replaces_the_built_in_script_and_no_journal_means_a_stub(agent_dir, tmp_path, disk_view):
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps([{"tool_calls": [{"name": "bash", "input": {"command": "echo hi > hi.txt"}}]}, {"text": "bye"}])
    )
    proc = run_cli("wake", str(agent_dir), "--dry-run", "--script", str(script))
    assert proc.returncode == 0, proc.stderr
    receipt = last_receipt(proc.stdout)
    assert receipt["tool_calls"] == 1 and receipt["journal"] == "stub"
    assert (disk_view(agent_dir) / "hi.txt").read_text() == "hi\n"
    assert "harness stub" in (disk_view(agent_dir) / f"memory/journal/{today()}.md").read_text()


def test_bad_script_file_is_a_config_error(agent_dir, tmp_path):
    script = tmp_path / "bad.json"
    script.write_text('[{"tool_calls": 3}]')
    proc = run_cli("wake", str(agent_dir), "--script", str(script))
    assert proc.returncode == 2 and "turn 1" in proc.stderr
    assert not (agent_dir / "state" / EVENTS_FILE).exists()


def test_send_context_outbox_status_log(agent_dir):
    assert run_cli("send", str(agent_dir), "hello agent").returncode == 0
    ctx = run_cli("context", str(agent_dir))  # a dry run's: it holds the message back, and says so
    assert ctx.returncode == 0 and "hello agent" not in ctx.stdout and "Wake #1." in ctx.stdout
    assert "1 message(s) from your human wait for the first live wake" in ctx.stdout
    live = run_cli("context", str(agent_dir), "--live")
    assert live.returncode == 0 and "hello agent" in live.stdout
    assert "hello agent" in (agent_dir / "state/inbox.txt").read_text()  # context drained nothing
    assert not (agent_dir / "state/state.json").exists()  # and counted nothing
    woke = run_cli("wake", str(agent_dir))
    assert woke.returncode == 0 and last_receipt(woke.stdout)["messages_waiting"] == 1
    assert "hello agent" in (agent_dir / "state/inbox.txt").read_text()  # a dry run leaves it for a live wake
    status = run_cli("status", str(agent_dir))
    assert status.returncode == 0 and "wakes        1" in status.stdout and "lock         free" in status.stdout
    assert "agent" in run_cli("status", str(agent_dir.parent)).stdout  # ROOT form: a table of agents
    log = run_cli("log", str(agent_dir))
    assert "wake_started" in log.stdout and "wake_finished" in log.stdout
    raw = run_cli("log", str(agent_dir), "--json").stdout.splitlines()
    assert all(set(json.loads(line)) == {"run_id", "type", "timestamp", "data"} for line in raw)
    assert "no messages" in run_cli("outbox", str(agent_dir)).stdout
