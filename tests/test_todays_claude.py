"""Today's Claude (issue 44): the 5.x rules met at the wire, errors named truly, effort and thinking
the agent's to choose, and what the model said between tool calls kept.

The real `anthropic` SDK talks to orchestrator/testing/fakeapi.py, which applies the 5.x rules of
its own (STRICT): a request the real API would refuse is a 400 there too, and a thinking block that
does not come back unchanged is one. Tools run in the real sandbox.
"""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path

import pytest

from orchestrator.policy.agent import load_agent
from orchestrator.records import ledger
from orchestrator.records.event_types import ModelResponse
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.records.transcript import find_run, read_lines
from orchestrator.testing.fakeapi import FAKE_KEY, FakeAPI, Reply, api_error, text, thinking, tool_use, turn, usage
from orchestrator.views.logview import render_line
from orchestrator.wake.loop import wake
from orchestrator.wake.model import LiveModel
from tests.helpers import live_wake, run_cli, set_policy


def fast_wake(agent_dir: Path, **kwargs):
    """A live wake whose mid-stream retries wait 1 ms, not the SDK's 0.5 s."""
    agent = load_agent(agent_dir)
    model = LiveModel(agent.model, FAKE_KEY, effort=agent.effort, thinking=agent.thinking, retry_delay_s=0.001)
    return wake(agent, live=True, model=model, **kwargs)


def responses(agent_dir: Path) -> list[ModelResponse]:
    return [e.record for e in read_events(agent_dir / "state" / EVENTS_FILE) if isinstance(e.record, ModelResponse)]


def set_model(agent_dir: Path, **keys) -> None:
    import yaml

    config = agent_dir / "agent.yaml"
    data = yaml.safe_load(config.read_text())
    data.update(keys)
    config.write_text(yaml.safe_dump(data))


# -- the request a 5.x model accepts ----------------------------------------------------------------


def test_a_new_agent_runs_on_sonnet_5_5_with_adaptive_thinking_summaries_and_its_effort(agent_dir, fake_api):
    set_model(agent_dir, effort="xhigh")
    api = fake_api([turn(text("Looking."), tool_use("bash", {"command": "echo hi"})), turn(text("done"))])
    receipt = live_wake(agent_dir)
    assert receipt.status == "done" and receipt.model == "claude-sonnet-5-5"
    body = api.requests[0].body
    assert body["output_config"] == {"effort": "xhigh"}
    assert body["thinking"] == {"type": "adaptive", "display": "summarized"}
    assert not {"temperature", "top_p", "top_k"} & set(body) and "tool_choice" not in body


def test_an_older_model_gets_no_thinking_and_no_effort_it_would_refuse(agent_dir, fake_api):
    set_model(agent_dir, model="claude-haiku-4-5")
    api = fake_api([turn(text("done"))])
    assert live_wake(agent_dir).status == "done"
    assert "thinking" not in api.requests[0].body and "output_config" not in api.requests[0].body


def test_an_existing_agent_on_sonnet_4_6_is_not_switched_to_thinking_unless_it_asks(agent_dir, fake_api):
    set_model(agent_dir, model="claude-sonnet-4-6")
    api = fake_api([turn(text("done")), turn(text("done"))])
    assert live_wake(agent_dir).status == "done" and "thinking" not in api.requests[0].body
    set_model(agent_dir, thinking="adaptive", effort="max")
    assert live_wake(agent_dir).status == "done"
    assert api.requests[1].body["thinking"] == {"type": "adaptive"} and api.requests[1].body["output_config"] == {
        "effort": "max"
    }


def test_an_effort_or_thinking_the_model_refuses_is_one_config_line(agent_dir):
    from orchestrator.policy.agent import AgentError

    set_model(agent_dir, model="claude-haiku-4-5", effort="low")
    with pytest.raises(AgentError, match=r"agent.yaml:\d+: effort: claude-haiku-4-5 does not accept 'low'"):
        load_agent(agent_dir)
    set_model(agent_dir, model="claude-sonnet-5-5", effort=None, thinking="disabled")
    with pytest.raises(AgentError, match=r"thinking: .*between_tools turns thinking off"):
        load_agent(agent_dir)
    set_model(agent_dir, thinking="between_tools")
    assert load_agent(agent_dir).thinking.type == "between_tools"
    set_model(agent_dir, model="claude-haiku-4-5", thinking={"type": "enabled", "budget_tokens": 8000})
    with pytest.raises(AgentError, match=r"budget_tokens \(8,000\) must be below .*max_output_tokens \(4,096\)"):
        load_agent(agent_dir)


def test_the_fake_refuses_what_the_5x_api_refuses():
    import anthropic

    with FakeAPI(then=turn(text("ok"))) as api:
        client = anthropic.Anthropic(api_key=FAKE_KEY, base_url=api.url, max_retries=0)
        base = dict(model="claude-sonnet-5-5", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
        tools = [{"name": "t", "input_schema": {"type": "object"}}]
        for extra in (
            {"tool_choice": {"type": "any"}, "tools": tools},
            {"thinking": {"type": "enabled", "budget_tokens": 2000}},
            {"thinking": {"type": "disabled"}},
            {"extra_body": {"temperature": 0.5}},
        ):
            with pytest.raises(anthropic.BadRequestError):
                client.messages.create(**base, **extra)
        assert client.messages.create(**base, tool_choice={"type": "none"}, tools=tools).content
        assert client.messages.create(**{**base, "model": "claude-haiku-4-5"}, tool_choice={"type": "any"}, tools=tools)
        client.close()


# -- thinking blocks: kept, signed, shown ------------------------------------------------------------


def test_words_between_tool_calls_come_back_as_thinking_and_are_shown_and_sent_back_unchanged(agent_dir, fake_api):
    api = fake_api(
        [
            turn(thinking("I should look first."), text("Listing the workspace."), tool_use("bash", {"command": "ls"})),
            turn(text("Writing a note."), tool_use("bash", {"command": "echo a > a.txt"})),
            turn(text("All done.")),
        ]
    )
    said: list[str] = []
    receipt = live_wake(agent_dir, echo=said.append)
    assert receipt.status == "done" and len(api.requests) == 3  # any changed block would have been a 400
    first = api.requests[1].body["messages"][1]["content"]
    assert [b["type"] for b in first] == ["thinking", "thinking", "tool_use"]  # words before a call: thinking
    assert first[1]["thinking"] == "Listing the workspace." and first[1]["signature"]
    assert "step 1: (I should look first. Listing the workspace.)" in said and "step 2: (Writing a note.)" in said
    lines = [render_line(line) for line in read_lines(find_run(agent_dir / "state", receipt.run_id))]
    assert any("(thinking) Listing the workspace." in line for line in lines)
    thought = sum(r.usage.thinking_tokens for r in responses(agent_dir))
    assert thought > 0 and receipt.usage.thinking_tokens == thought
    assert ledger.read_book(agent_dir / "state").lifetime.thinking_tokens == thought


def test_a_thinking_block_changed_on_its_way_back_is_refused():
    import anthropic

    with FakeAPI([turn(thinking("plan"), tool_use("bash", {"command": "ls"}))]) as api:
        client = anthropic.Anthropic(api_key=FAKE_KEY, base_url=api.url, max_retries=0)
        ask = dict(model="claude-sonnet-5-5", max_tokens=100, thinking={"type": "adaptive", "display": "summarized"})
        first = client.messages.create(**ask, messages=[{"role": "user", "content": "go"}])
        blocks = [b.model_dump(exclude_none=True) for b in first.content]
        blocks[0]["thinking"] = "a different plan"
        answer = {"type": "tool_result", "tool_use_id": blocks[1]["id"], "content": "ok"}
        history = [{"role": "user", "content": "go"}, {"role": "assistant", "content": blocks}]
        with pytest.raises(anthropic.BadRequestError, match="modified"):
            client.messages.create(**ask, messages=[*history, {"role": "user", "content": [answer]}])
        without = [{"role": "assistant", "content": blocks[1:]}]
        with pytest.raises(anthropic.BadRequestError, match="unchanged"):
            client.messages.create(**ask, messages=[history[0], *without, {"role": "user", "content": [answer]}])
        client.close()


# -- errors named truly ---------------------------------------------------------------------------


def test_an_overloaded_error_mid_stream_is_retried_and_its_tokens_counted_once(agent_dir, fake_api):
    broken = Reply(content=[text("...")], usage=usage(1000, 5), midstream_error="overloaded_error")
    api = fake_api([broken, turn(text("fine now"), usage=usage(1000, 7))])
    receipt = fast_wake(agent_dir)
    assert (receipt.status, receipt.steps, len(api.requests)) == ("done", 1, 2)
    # message_start said 1000 input and 1 output before the break: counted once, beside the answer's
    assert receipt.usage.input_tokens == 2000 and receipt.usage.output_tokens == 1 + 7
    book = ledger.read_book(agent_dir / "state")
    assert book.lifetime.calls == 2 and book.lifetime.tokens == receipt.tokens
    assert receipt.usd == pytest.approx((2000 * 2 + 8 * 10) / 1e6)  # Sonnet 5.5: $2 / $10


def test_an_api_error_mid_stream_every_time_is_a_dead_letter_that_counts_its_retries(agent_dir, fake_api):
    fake_api(then=Reply(content=[text("...")], usage=usage(10, 1), midstream_error="api_error"))
    receipt = fast_wake(agent_dir)
    assert receipt.status == "dead_letter"
    assert "mid-stream" in receipt.reason and "api_error" in receipt.reason and "after 4 retries" in receipt.reason


def test_a_404_says_no_retries_were_made(agent_dir, fake_api):
    api = fake_api([api_error(404, "not_found_error", "model: claude-sonnet-5-5")])
    receipt = live_wake(agent_dir)
    assert receipt.status == "dead_letter" and len(api.requests) == 1
    assert "HTTP 404" in receipt.reason and "retr" not in receipt.reason


def test_a_529_retried_twice_then_failing_for_good_says_two(agent_dir, fake_api):
    fake_api([api_error(529), api_error(529), api_error(400, "invalid_request_error", "bad")])
    receipt = live_wake(agent_dir)
    assert "HTTP 400" in receipt.reason and receipt.reason.endswith("after 2 retries")


def test_a_refusal_keeps_its_category(agent_dir, fake_api):
    details = {"type": "refusal", "category": "cyber", "explanation": "This could enable malware."}
    fake_api([Reply(content=[], stop_reason="refusal", stop_details=details)])
    receipt = live_wake(agent_dir)
    assert receipt.status == "dead_letter"
    assert receipt.reason.startswith("refusal:") and "category: cyber" in receipt.reason
    assert "enable malware" in receipt.reason


def test_a_full_context_window_has_its_own_reason(agent_dir, fake_api):
    fake_api([turn(text("..."), stop_reason="model_context_window_exceeded", usage=usage(999_000, 1))])
    receipt = live_wake(agent_dir)
    assert receipt.status == "dead_letter"
    assert receipt.reason.startswith("model_context_window_exceeded:") and "999,000 tokens" in receipt.reason


# -- the wrap-up turn at the token cap ---------------------------------------------------------------


def test_the_wrap_up_turn_on_5x_reads_the_conversation_from_the_cache(agent_dir, fake_api):
    set_policy(agent_dir, {"budget": {"max_tokens_per_wake": 1}})
    api = fake_api([turn(tool_use("bash", {"command": "echo one"})), turn(text("Journal: ran echo."))])
    receipt = live_wake(agent_dir)
    assert receipt.status == "budget_stop" and len(api.requests) == 2
    final = responses(agent_dir)[-1].usage
    assert final.cache_read_tokens > 0 and final.cache_write_tokens < final.cache_read_tokens
    assert json.dumps(api.requests[1].body.get("tool_choice")) == json.dumps(api.requests[0].body.get("tool_choice"))


# -- the line-up: `wakeloop models`, and warnings for a legacy or retiring model ------------------------


def test_models_lists_every_sdk_model_with_its_price_and_lifecycle():
    from tests.test_ledger import sdk_models

    out = run_cli("models", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["id"]: r for r in json.loads(out.stdout)}
    for model in sdk_models():
        undated = model if model in rows else model.rsplit("-", 1)[0]
        assert undated in rows and rows[undated]["price"] is not None, model
    assert rows["claude-sonnet-5-5"]["price"]["input"] == 2 and rows["claude-sonnet-5-5"]["lifecycle"] == "active"
    assert rows["claude-sonnet-5-5"]["context_window"] == 1_000_000
    assert "unpriced" in rows["claude-mythos-preview"]["price"]
    assert rows["claude-opus-4-5"]["retires_at"] == "2027-01-22"
    text = run_cli("models").stdout
    assert "claude-haiku-5-5" in text and "(>100K: 0.5/2.5/0.05)" in text


def test_models_live_asks_the_api_and_without_a_key_says_so():
    with FakeAPI() as api:
        env = {"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": FAKE_KEY}
        out = run_cli("models", "--json", "--live", env=env)
        assert out.returncode == 0, out.stderr
        assert [r.path.split("?")[0] for r in api.requests] == ["/v1/models"]
    rows = {r["id"]: r for r in json.loads(out.stdout)}
    assert rows["claude-sonnet-5-5"]["live"] and rows["claude-sonnet-5-5"]["thinking"] == ["adaptive"]
    opus = rows["claude-opus-4-5"]
    assert opus["lifecycle"] == "deprecated" and "GET /v1/models" in opus["warning"]
    assert not rows["claude-haiku-4-5"]["live"]
    none = run_cli("models", "--live", env={"ANTHROPIC_API_KEY": ""})
    assert none.returncode == 2 and "ANTHROPIC_API_KEY" in none.stderr and "Traceback" not in none.stderr


def test_status_and_a_notification_warn_of_a_legacy_or_retiring_model(agent_dir):
    from datetime import date

    from orchestrator.notify import outcomes, queue
    from orchestrator.records.models import lifecycle_warning

    assert lifecycle_warning("claude-sonnet-5-5") is None
    assert "retires on 2027-01-22 (46 days)" in lifecycle_warning("claude-opus-4-5", date(2026, 12, 7))
    assert "claude-opus-4-5 is deprecated" in lifecycle_warning("claude-opus-4-5", date(2026, 10, 1))
    set_model(agent_dir, model="claude-sonnet-4-6", notify=[{"webhook": "https://h.example/x"}])
    out = run_cli("status", str(agent_dir))
    assert "warning    model claude-sonnet-4-6 is legacy" in out.stdout
    fleet = run_cli("status", str(agent_dir.parent))
    assert f"{agent_dir.name}: model claude-sonnet-4-6 is legacy" in fleet.stdout
    agent = load_agent(agent_dir)
    outcomes.model_warning(agent, "r1")
    outcomes.model_warning(agent, "r2")  # a legacy model: once a week, not every wake
    waiting = [i for i in queue.pending(agent.state_dir) if i.event == "model_warning"]
    assert len(waiting) == 1 and "claude-sonnet-4-6 is legacy" in waiting[0].payload["text"]


def test_metrics_count_thinking_tokens_as_their_own_kind():
    from prometheus_client import CollectorRegistry

    from orchestrator import metrics
    from orchestrator.records.receipt import Usage

    registry = CollectorRegistry()
    response = ModelResponse(step=1, stop_reason="tool_use", usage=Usage(10, 50, thinking_tokens=40), model="m")
    metrics._count(metrics._Metrics(registry), "a", "m", response)
    thinking = registry.get_sample_value("wakeloop_tokens_total", {"agent": "a", "kind": "thinking"})
    assert thinking == 40 and registry.get_sample_value("wakeloop_tokens_total", {"agent": "a", "kind": "output"}) == 50


# -- the API's limits are the fleet's: one gate per key -----------------------------------------------


def test_an_empty_bucket_seen_by_one_wake_holds_every_request_with_that_key_until_its_reset(monkeypatch):
    import time
    from datetime import datetime, timedelta

    from orchestrator.wake.ratelimit import gate_for

    key = "sk-ant-test-gate-empty-bucket"
    arrived: list[float] = []
    resets: list[float] = []

    def answer(empty: bool):
        def respond(rec):
            arrived.append(time.time())
            if not empty:
                return turn(text("ok"))
            reset = datetime.now(UTC) + timedelta(milliseconds=300)  # the bucket refills then
            resets.append(reset.timestamp())
            headers = {
                "anthropic-ratelimit-requests-remaining": "0",
                "anthropic-ratelimit-requests-reset": reset.isoformat(),
            }
            return Reply(content=[text("ok")], stop_reason="end_turn", headers=headers)

        return respond

    with FakeAPI([answer(True), answer(False)]) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        one, other = (LiveModel("claude-sonnet-5-5", key, stream=False) for _ in range(2))
        ask = dict(system=[], tools=[], messages=[{"role": "user", "content": "hi"}], max_tokens=10)
        one.call(**ask)  # its answer says the bucket is empty until `reset`
        other.call(**ask)  # another wake, same key: sent only after the reset
        one.close(), other.close()
    assert arrived[1] >= resets[0] - 0.01
    assert gate_for(key).waited_s > 0 and gate_for("sk-ant-test-another-key").waited_s == 0


def test_a_429_closes_the_gate_for_its_retry_after_and_the_gate_honours_its_own_clock():
    from orchestrator.wake.ratelimit import Gate

    now = [100.0]
    slept: list[float] = []
    gate = Gate(clock=lambda: now[0], sleep=lambda s: (slept.append(s), now.__setitem__(0, now[0] + s)))
    gate.observe(429, {"retry-after-ms": "1500"})
    assert gate.wait() == pytest.approx(1.5) and slept == [pytest.approx(1.5)]
    gate.observe(200, {"anthropic-ratelimit-tokens-remaining": "5"})  # not empty: no hold
    assert gate.wait() == 0
    gate.observe(429, {"retry-after": "999"})  # never trusted past MAX_HOLD_S
    assert gate.wait() == pytest.approx(60.0)


def test_the_gate_mirrors_the_requests_bucket_and_lets_waiters_go_at_its_refill_rate():
    from orchestrator.wake.ratelimit import Gate

    now = [0.0]
    gate = Gate(clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert gate.wait() == 0  # nothing known yet: no pacing
    gate.observe(200, {"anthropic-ratelimit-requests-limit": "1200", "anthropic-ratelimit-requests-remaining": "2"})
    waits = [gate.wait() for _ in range(5)]  # 20 a second: two now, then one every 50 ms
    assert waits == [0, 0, pytest.approx(0.05), pytest.approx(0.05), pytest.approx(0.05)]
    assert now[0] == pytest.approx(0.15)


def test_a_step_with_more_blocks_than_the_look_back_still_reads_the_conversation_from_the_cache(agent_dir, fake_api):
    many = [tool_use("bash", {"command": f"echo {n}"}) for n in range(12)]  # 24 blocks with their results
    api = fake_api([turn(tool_use("bash", {"command": "echo first"})), turn(*many), turn(text("done"))])
    assert live_wake(agent_dir).status == "done"
    usage = [r.usage for r in responses(agent_dir)]
    assert usage[2].cache_read_tokens >= usage[1].prompt_tokens  # all the second request held, read back
    third = api.requests[2].body
    marked = [m for m in third["messages"] if "cache_control" in json.dumps(m)]
    assert len(marked) == 2  # the last user message and the one before the 24 new blocks


def test_at_display_omitted_the_empty_thinking_blocks_go_back_and_the_transcript_says_they_were_not_asked_for(
    agent_dir, fake_api
):
    set_model(agent_dir, thinking={"type": "adaptive", "display": "omitted"})
    api = fake_api([turn(text("Listing."), tool_use("bash", {"command": "ls"})), turn(text("done"))])
    receipt = live_wake(agent_dir)
    assert receipt.status == "done" and api.requests[0].body["thinking"] == {"type": "adaptive", "display": "omitted"}
    sent_back = api.requests[1].body["messages"][1]["content"][0]
    assert sent_back["type"] == "thinking" and sent_back["thinking"] == "" and sent_back["signature"]
    lines = [render_line(line) for line in read_lines(find_run(agent_dir / "state", receipt.run_id))]
    assert any("(thinking, not shown: the model was not asked for a summary)" in line for line in lines)
