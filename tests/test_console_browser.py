"""The console in a real browser: Debian's headless Chromium driven by Selenium, against `wakeloop serve --http`.

One root, built once for the module with the CLI and real wakes: `healthy`
(a dry-run wake that ran a command and sent a message holding a <script>),
`failing` (two dead letters), `paused` (`wakeloop pause`) and `midwake`
(a live wake whose model request the fake API holds until the module ends).
One serve process, one browser session, signed in at the start with the
sign-in URL serve printed (reading needs the token, on loopback too). Every
page is checked for what a person would look at, and for any error in the
browser's console; a screenshot of each is kept under $OUT (or the test's
temp dir). Chromium resolves `rebind.example` to 127.0.0.1
(--host-resolver-rules), as a DNS-rebinding page's name would.

Selenium is pointed at /usr/bin/chromedriver and /usr/bin/chromium, so its
manager never downloads anything; Chromium runs with every background
network feature off (this machine has no internet, and must not try).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.escapes.surfaces.receivers import Hook
from orchestrator.testing.fakeapi import FAKE_KEY, FakeAPI, text, tool_use, turn
from tests.helpers import REPO, make_agent, run_cli, scrubbed_env, wait_for
from tests.helpers.browser import CHROMEDRIVER, CHROMIUM, arrived, by_css, chromium

pytestmark = pytest.mark.docker

TOKEN = "console-test-token-5b1f9a"
NEVER = "0 0 1 1 *"  # a cron line that does not tick during the tests
XSS = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> look'
BOX_SAYS = "hello-from-the-box"
WAIT_S = 90
REBOUND = "rebind.example"  # a name the browser resolves to 127.0.0.1, as DNS rebinding would


def _script(path: Path, turns: list) -> str:
    path.write_text(json.dumps(turns))
    return str(path)


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """url, serve's output lines, the fake API, the webhook receiver, the root, and `release`:
    set it to let the mid-wake agent's model answer."""
    tmp = tmp_path_factory.mktemp("console")
    root = tmp / "agents"
    release = threading.Event()

    def held(rec):  # the mid-wake agent's model: its first request waits for the module's end
        if not any(m.get("role") == "assistant" for m in rec.body.get("messages", [])):
            release.wait(timeout=600)
            return turn(text("Telling my human."), tool_use("send_message", {"text": "the slow step is done"}))
        return turn(text("Done."))

    with FakeAPI(then=held) as api, Hook() as hook:
        make_agent(root, "healthy", schedule=NEVER)
        make_agent(root, "failing", schedule=NEVER)
        make_agent(root, "paused", schedule=NEVER)
        make_agent(root, "midwake", schedule=NEVER, live=True, notify=[{"webhook": hook.url(), "on": ["message"]}])
        hello = _script(
            tmp / "hello.json",
            [
                {"text": "Looking around.", "tool_calls": [{"name": "bash", "input": {"command": f"echo {BOX_SAYS}"}}]},
                {"text": "Telling my human.", "tool_calls": [{"name": "send_message", "input": {"text": XSS}}]},
                {"text": "Done."},
            ],
        )
        refuse = _script(tmp / "refuse.json", [{"text": "No.", "stop_reason": "refusal"}])
        wakes = [
            subprocess.Popen(
                [sys.executable, "-m", "orchestrator", "wake", str(root / "healthy"), "--script", hello],
                cwd=REPO,
                env=scrubbed_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        ]
        for _ in range(2):
            assert run_cli("wake", str(root / "failing"), "--script", refuse).returncode == 1
        assert wakes[0].wait(timeout=120) == 0, wakes[0].communicate()
        run_cli("pause", str(root / "paused")).check_returncode()
        run_cli("run-now", str(root / "midwake")).check_returncode()
        env = scrubbed_env(
            {
                "WAKELOOP_CONSOLE_TOKEN": TOKEN,
                "ANTHROPIC_BASE_URL": api.url,
                "ANTHROPIC_API_KEY": FAKE_KEY,
                "WAKELOOP_REPORTS": str(tmp / "reports"),
            }
        )
        serve = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "serve", str(root), "--http", "127.0.0.1:0"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(serve.stdout), daemon=True).start()
        try:
            found = wait_for(
                lambda: next(
                    (m for line in list(lines) if (m := re.search(r"console: (http://127\.0\.0\.1:\d+/)", line))), None
                ),
                "the console's address",
                60,
            )
            sign_in = wait_for(
                lambda: next((m for line in list(lines) if (m := re.search(r"console: sign in at (\S+)", line))), None),
                "the sign-in URL",
                60,
            )
            wait_for(lambda: api.requests, "the mid-wake agent's model request", WAIT_S)
            yield SimpleNamespace(
                url=found.group(1),
                sign_in=sign_in.group(1),
                lines=lines,
                api=api,
                hook=hook,
                root=root,
                release=release,
            )
        finally:
            release.set()
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=120)


@pytest.fixture(scope="module")
def browser(tmp_path_factory, console):
    """Chromium, signed in with the URL serve printed."""
    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), "scripts/test.sh installs chromium"
    driver = chromium(
        tmp_path_factory.mktemp("chromium"),
        "--disable-quic",
        "--window-size=1400,1000",
        f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1",
    )
    driver.get(console.sign_in)
    assert driver.current_url == console.url, "signed in, and the token left the address bar"
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ["OUT"]) / "console" if os.environ.get("OUT") else tmp_path_factory.mktemp("shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def visit(driver, url: str, shots: Path, name: str):
    """Load a page, keep its screenshot, and fail on anything in the browser's console."""
    driver.get(url)
    driver.save_screenshot(str(shots / f"{name}.png"))
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert not errors, f"{url}: the browser console says: {errors}"
    return driver


def test_the_sign_in_url_is_printed_once_and_a_browser_without_it_sees_only_the_login_page(console, browser, shots):
    assert TOKEN in console.sign_in and sum(TOKEN in line for line in list(console.lines)) == 1
    assert TOKEN not in browser.current_url
    cookies = browser.get_cookies()
    assert [c["name"] for c in cookies] == ["wakeloop_session"] and cookies[0]["httpOnly"]
    assert TOKEN not in cookies[0]["value"]  # an HMAC of the token, not the token
    browser.delete_all_cookies()
    try:
        visit(browser, f"{console.url}agents/healthy", shots, "login-needed")
        assert "/login?next=/agents/healthy" in browser.current_url and by_css(browser, "#token")
        assert not by_css(browser, "#outbox")
    finally:
        browser.get(console.sign_in)
    assert browser.current_url == console.url


def test_a_rebound_name_reaches_the_console_and_gets_421(console, browser, shots):
    """DNS rebinding in a real browser: rebind.example resolves to 127.0.0.1, the console refuses it."""
    port = console.url.rstrip("/").rsplit(":", 1)[1]
    for path in ("", "agents/healthy", "metrics"):
        browser.get(f"http://{REBOUND}:{port}/{path}")
        browser.save_screenshot(str(shots / f"rebound-{path.replace('/', '-') or 'fleet'}.png"))
        body = browser.find_element("css selector", "body").text
        assert "does not answer to Host" in body and "healthy" not in body and "wakeloop_" not in body, body
    logged = browser.get_log("browser")  # read, so the next page's check starts clean
    assert logged and all("421" in e["message"] for e in logged), logged
    browser.get(console.url)


def test_fleet_page_marks_the_failing_paused_and_running_agents_and_draws_the_cost_charts(console, browser, shots):
    url = console.url
    visit(browser, url, shots, "fleet")
    rows = {r.get_attribute("id"): r for r in by_css(browser, "table.fleet tbody tr")}
    assert set(rows) == {"agent-healthy", "agent-failing", "agent-paused", "agent-midwake"}
    assert "state-failing" in rows["agent-failing"].get_attribute("class")
    assert "failing since" in rows["agent-failing"].text and "2 in a row" in rows["agent-failing"].text
    assert "state-paused" in rows["agent-paused"].get_attribute("class") and "paused" in rows["agent-paused"].text
    assert "running · step 1" in rows["agent-midwake"].text
    assert "ok" in rows["agent-healthy"].text and "#1 done" in rows["agent-healthy"].text
    charts = by_css(browser, "table.fleet svg.chart")
    assert len(charts) == 4 and all(len(c.find_elements("css selector", "rect")) == 30 for c in charts)


def test_agent_page_shows_history_chart_mandate_policy_and_the_outbox_as_text_never_run(console, browser, shots):
    url = console.url
    visit(browser, f"{url}agents/healthy", shots, "agent")
    assert "1 in the retained history" in browser.find_element("css selector", "body").text
    assert "done" in by_css(browser, "#wakes tbody tr")[0].text
    assert len(by_css(browser, "#cost-chart svg rect")) == 30
    assert "mandate" in browser.find_element("css selector", "#mandate").text.lower()
    outbox = browser.find_element("css selector", "#outbox").text
    assert "<script>window.__pwned = 1</script>" in outbox and "look" in outbox  # shown as text
    assert browser.execute_script("return window.__pwned") is None  # and never run
    assert not by_css(browser, "#outbox script, #outbox img")
    csp = urllib.request.urlopen(
        urllib.request.Request(f"{url}agents/healthy", headers={"Authorization": f"Bearer {TOKEN}"})
    ).headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp


def test_a_wakes_transcript_shows_each_turn_the_command_and_its_output(console, browser, shots):
    url = console.url
    visit(browser, f"{url}agents/healthy", shots, "agent")
    browser.find_element("css selector", "#wakes tbody tr a").click()
    transcript = arrived(browser, "#transcript").text
    browser.save_screenshot(str(shots / "wake.png"))
    assert f"echo {BOX_SAYS}" in transcript and BOX_SAYS in transcript.split(f"echo {BOX_SAYS}", 1)[1]
    assert "exit 0" in transcript and "Looking around." in transcript
    assert "done" in browser.find_element("css selector", "#end").text
    assert not [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def test_the_running_wake_is_followed_live_on_its_agents_page(console, browser, shots):
    url = console.url
    visit(browser, f"{url}agents/midwake", shots, "agent-running")
    assert "running now · step 1" in browser.find_element("css selector", "#state").text
    frame = browser.find_element("css selector", "iframe.live")
    browser.switch_to.frame(frame)
    try:
        assert "running: this page follows it" in browser.find_element("css selector", "#live").text
        assert "waiting for the model" in browser.find_element("css selector", "#waiting").text
        assert browser.find_element("css selector", "meta[http-equiv=refresh]").get_attribute("content") == "2"
    finally:
        browser.switch_to.default_content()


def test_signed_in_run_now_starts_a_wake_and_a_forged_request_is_refused(console, browser, shots):
    url, lines = console.url, console.lines
    browser.delete_all_cookies()
    visit(browser, f"{url}agents/healthy", shots, "login")  # signed out: sent to sign in, then back
    assert "/login?next=/agents/healthy" in browser.current_url and not by_css(browser, "#run-now")
    browser.find_element("css selector", "#token").send_keys(TOKEN)
    browser.find_element("css selector", "#sign-in").click()
    arrived(browser, "#run-now").click()
    assert "one wake requested" in arrived(browser, "#said").text
    wait_for(lambda: any("healthy: wake 2 done" in line for line in list(lines)), "the run-now wake", WAIT_S)
    visit(browser, f"{url}agents/healthy", shots, "agent-after-run-now")
    assert len(by_css(browser, "#wakes tbody tr")) == 2
    forged = urllib.request.Request(
        f"{url}agents/healthy/pause", data=b"csrf=nope", method="POST", headers={"Origin": "http://evil.example"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged)
    assert refused.value.code == 403


def test_escapes_page_shows_the_kept_report_and_metrics_count_what_happened(console, browser, shots):
    url = console.url
    visit(browser, f"{url}escapes", shots, "escapes")
    assert "No report yet" in browser.find_element("css selector", "#no-reports").text
    assert by_css(browser, "#run-escapes")  # signed in: the button is there
    metrics = urllib.request.urlopen(f"{url}metrics").read().decode()
    assert 'wakeloop_wakes_total{agent="healthy",status="done"} 1.0' in metrics
    assert 'wakeloop_tool_calls_total{exit_class="ok",tool="bash"}' in metrics
    assert re.search(r"wakeloop_sandbox_call_duration_seconds_count\{tool=\"bash\"\} [1-9]", metrics)
    assert re.search(r"wakeloop_scheduler_lag_seconds_count [1-9]", metrics)
    assert re.search(r'wakeloop_sandbox_pool_takes_total\{result="(hit|miss)"\} [1-9]', metrics)
    assert "wakeloop_sandbox_containers " in metrics


def test_when_the_held_model_answers_the_wake_finishes_and_its_request_and_message_are_counted(console):
    console.release.set()
    wait_for(lambda: any("midwake: wake 1 done" in line for line in list(console.lines)), "the held wake", WAIT_S)
    wait_for(lambda: console.hook.received, "the agent's message at the webhook", WAIT_S)

    def scraped():
        text = urllib.request.urlopen(f"{console.url}metrics").read().decode()
        return text if 'wakeloop_notifications_total{outcome="sent"} 1.0' in text else None

    metrics = wait_for(scraped, "the sent notification in /metrics", 30)
    assert 'wakeloop_model_requests_total{agent="midwake",model="claude-sonnet-5-5"} 2.0' in metrics
    assert 'wakeloop_notifications_total{outcome="queued"} 1.0' in metrics
    assert re.search(r'wakeloop_tokens_total\{agent="midwake",kind="output"\} [1-9]', metrics)
    assert 'wakeloop_cost_usd_total{agent="midwake"' in metrics


def test_a_live_agents_cost_today_is_a_bar_on_its_chart(console, browser, shots):
    wait_for(lambda: any("midwake: wake 1 done" in line for line in list(console.lines)), "the held wake", WAIT_S)
    visit(browser, f"{console.url}agents/midwake", shots, "agent-with-cost")
    bars = by_css(browser, "#cost-chart svg rect")
    assert len(bars) == 30 and "bar zero" not in bars[-1].get_attribute("class")  # today, the last
    assert float(bars[-1].get_attribute("height")) > 2 and "$0.00" in bars[-1].text + bars[-1].get_attribute(
        "innerHTML"
    )
    visit(browser, console.url, shots, "fleet-after")
