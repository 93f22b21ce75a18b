"""What the console keeps on disk across serve's restarts: the fleet rows (console/pages.py
ROWS_FILE, in ROOT) and each agent's wake index (fleet/wake_history.py INDEX_FILE, in its state/).

A restarted console's first fleet view and wake histories come from them without loading an
agent or parsing an event line; a changed file is read again; a corrupt, hostile or linked
index is read past (the logs parsed again) and written anew. The compiled templates are kept
too (console/template_cache.py, in the user's own cache folder), never in a folder another
could write; and a view asked during the warm-up gets the warm-up's page, not a second pass
beside it. No engine needed.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import urllib.request
from pathlib import Path

import jinja2
import pytest

from orchestrator.console import app as app_mod
from orchestrator.console import pages as pages_mod
from orchestrator.console import template_cache
from orchestrator.console.app import Console, start
from orchestrator.console.auth import Access
from orchestrator.console.pages import ROWS_FILE, Pages
from orchestrator.fleet import wake_history
from orchestrator.fleet.wake_history import INDEX_FILE, WakeIndex
from orchestrator.policy.agent import init_agent
from orchestrator.records.events import EVENTS_FILE, EventLog
from tests.helpers.console import TOKEN

NAMES = ("a", "b", "c")
LINES_PER_WAKE = 2  # finish(): wake_finished and a tool_call


def finish(sd: Path, n: int) -> None:
    run = f"{sd.parent.name}{n:04d}"
    EventLog(sd / EVENTS_FILE, run, secrets=()).emit(
        "wake_finished",
        status="done",
        receipt={"run_id": run, "wake": n, "status": "done", "steps": 1, "duration_ms": 10},
    )
    EventLog(sd / EVENTS_FILE, run, secrets=()).emit("tool_call", tool="bash")


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "agents"
    for name in NAMES:
        init_agent(root / name)
        config = root / name / "agent.yaml"  # due once a year: no wake falls due during a test
        config.write_text(config.read_text().replace('schedule: "*/30 * * * *"', 'schedule: "0 0 1 1 *"'))
        for n in range(1, 4):
            finish(root / name / "state", n)
    return root


@pytest.fixture(autouse=True)
def one_day(monkeypatch):
    """The console's clock stands still: a test that straddles midnight UTC keeps its rows."""
    now = pages_mod.utcnow()
    monkeypatch.setattr(pages_mod, "utcnow", lambda: now)


@pytest.fixture
def loads(monkeypatch) -> list[str]:
    """The agents whose fleet row was read from their files (not taken from what was kept)."""
    read: list[str] = []
    real = pages_mod.fleet_row

    def counted(path, *args, **kwargs):
        read.append(path.name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(pages_mod, "fleet_row", counted)
    return read


def first_console(root: Path) -> Pages:
    """A console that has shown the fleet and every history once (serve's warm-up), then stopped."""
    pages = Pages(root)
    for row in pages.fleet()["rows"]:
        pages.wakes.recent(root / row["dir_name"] / "state")
    return pages


def wakes(index: WakeIndex, sd: Path) -> list[int]:
    return [row["wake"] for row in index.recent(sd)[1]]


def test_a_restarted_console_shows_the_fleet_and_histories_without_loading_an_agent_or_parsing_a_line(root, loads):
    before = first_console(root)
    assert sorted(loads) == list(NAMES) and (root / ROWS_FILE).is_file()
    assert before.wakes.parsed_lines == len(NAMES) * 3 * LINES_PER_WAKE
    loads.clear()
    after = Pages(root)  # serve restarted
    assert after.fleet()["rows"] == json.loads(json.dumps(before.fleet()["rows"]))
    assert loads == [], "every row came from what the first console kept"
    for name in NAMES:
        assert after.wakes.recent(root / name / "state") == before.wakes.recent(root / name / "state")
    assert after.wakes.parsed_lines == 0, "every history came from its index"


def test_a_changed_file_is_read_again_and_only_it(root, loads):
    first_console(root)
    loads.clear()
    finish(root / "a" / "state", 4)  # a's live log grew
    (root / "b" / "state" / "state.json").write_text('{"wake": 9, "tokens_lifetime": 0}')
    after = Pages(root)
    after.fleet()
    assert loads == ["b"], "only the row whose files changed was read again"
    assert wakes(after.wakes, root / "a" / "state") == [1, 2, 3, 4]
    assert after.wakes.parsed_lines == LINES_PER_WAKE, "the live log was read on from where the index stopped"
    live = root / "c" / "state" / EVENTS_FILE  # c's log replaced by a longer one: known by its inode
    os.replace(live, live.with_name("gone"))
    for n in range(7, 12):
        finish(root / "c" / "state", n)
    again = Pages(root)
    assert wakes(again.wakes, root / "c" / "state") == [7, 8, 9, 10, 11]


@pytest.mark.parametrize(
    "planted",
    [
        b"{not json",
        b"[]",
        b'{"version": 1}',
        b"\x00" * 100,
        b'{"version": 1, "files": [{"name": "events.jsonl", "key": [1, 2, 3], "offset": 99, "count": 1, "rows": []}]}',
        b'{"version": 1, "files": [{"name": "events.jsonl", "key": [0, 0, 0], "offset": 0, "count": 1, '
        b'"rows": [{"run_id": "evil"}]}]}',
        b'{"version": 1, "files": [{"name": "events.jsonl", "key": "x", "offset": 0, "count": 0, "rows": []}]}',
        b'{"version": 1, "files": [{"name": "events.jsonl", "key": [0, 0, 0], "offset": 0, "count": true, '
        b'"rows": []}]}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"version": 1, "files": []}' + b" " * wake_history.INDEX_CAP,
    ],
    ids=[
        "not JSON",
        "a list",
        "no files",
        "NULs",
        "offset past the end",
        "a row not ours",
        "a key not a list",
        "a count not a number",
        "nested too deep",
        "too big",
    ],
)
def test_a_corrupt_or_hostile_index_is_read_past_and_written_anew(root, planted):
    first_console(root)
    sd = root / "a" / "state"
    (sd / INDEX_FILE).write_bytes(planted)
    after = WakeIndex()
    assert wakes(after, sd) == [1, 2, 3] and after.parsed_lines == 3 * LINES_PER_WAKE
    assert wake_history.load_index(sd, wake_history.history(sd, EVENTS_FILE)), "a valid index was written in its place"


def test_an_index_that_matches_the_files_but_names_another_agents_rows_is_shown_only_on_its_own_page(root):
    """Whoever owns an agent folder can write its index as they can its log: what it says shows on
    that agent's page and nowhere else; another agent's index reached through a link is refused."""
    first_console(root)
    a, b = root / "a" / "state", root / "b" / "state"
    (a / INDEX_FILE).unlink()
    (a / INDEX_FILE).symlink_to(b / INDEX_FILE)
    index = WakeIndex()
    assert [r["run_id"] for r in index.recent(a)[1]] == ["a0001", "a0002", "a0003"]
    assert not (a / INDEX_FILE).is_symlink(), "the link was replaced by a's own index, not followed"
    assert [r["run_id"] for r in index.recent(b)[1]] == ["b0001", "b0002", "b0003"]
    (a / INDEX_FILE).unlink()
    os.link(b / INDEX_FILE, a / INDEX_FILE)  # a hard link: refused as well
    fresh = WakeIndex()
    assert [r["run_id"] for r in fresh.recent(a)[1]] == ["a0001", "a0002", "a0003"]
    assert fresh.parsed_lines == 3 * LINES_PER_WAKE


@pytest.mark.parametrize(
    "planted",
    [
        b"{not json",
        b'{"version": 1, "day": "1999-01-01", "rows": {}}',
        b'{"version": 1, "rows": {"a": {"row": 3, "key": []}}}',
        b"\xff" * 10,
    ],
    ids=["not JSON", "another day", "a row not a row", "not UTF-8"],
)
def test_corrupt_kept_rows_are_read_past(root, loads, planted):
    first_console(root)
    (root / ROWS_FILE).write_bytes(planted)
    loads.clear()
    rows = Pages(root).fleet()["rows"]
    assert sorted(loads) == list(NAMES) and [r["dir_name"] for r in rows] == list(NAMES)


def test_a_kept_row_is_shown_only_for_the_folder_it_is_kept_under(root, loads):
    first_console(root)
    kept = json.loads((root / ROWS_FILE).read_text())
    kept["rows"]["a"]["row"]["dir_name"] = "../b"
    (root / ROWS_FILE).write_text(json.dumps(kept))
    loads.clear()
    rows = Pages(root).fleet()["rows"]
    assert loads == [] and [r["dir_name"] for r in rows] == list(NAMES)


def test_a_kept_row_of_another_shape_is_forgotten_and_the_page_still_shows_every_agent(root, loads):
    """A rows file from another version (same ROWS_VERSION, rows the template cannot show) costs
    one fresh read, never a broken fleet page."""
    first_console(root)
    kept = json.loads((root / ROWS_FILE).read_text())
    kept["rows"]["b"]["row"] = {"agent": "b"}  # matching key, no state, no disk
    (root / ROWS_FILE).write_text(json.dumps(kept))
    loads.clear()
    console = Console(root, Access(TOKEN, loopback=True))
    listening = start(console, "127.0.0.1", 0)
    try:
        request = urllib.request.Request(listening.url, headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=30) as r:
            status, html = r.status, r.read().decode()
        assert console.warmed.wait(timeout=60)
    finally:
        listening.stop()
    assert status == 200 and all(f'id="agent-{n}"' in html for n in NAMES)
    assert set(loads) == set(NAMES), "the kept rows were forgotten and every row read afresh"


def _fleet_view(url: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return r.status, r.read().decode()


@pytest.fixture
def cache_home(tmp_path, monkeypatch) -> Path:
    """The user's cache folder, the test's own: where template_cache keeps the compiled templates."""
    monkeypatch.setenv(template_cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / template_cache.FOLDER


def test_compiled_templates_are_kept_for_the_next_start_in_a_folder_only_the_user_can_write(
    root, cache_home, monkeypatch
):
    monkeypatch.setattr(app_mod, "FIRST_VIEW_WAIT_S", 0)  # no view comes: the warm-up goes on at once
    first = Console(root, Access(TOKEN, loopback=True))
    assert first.warmed.wait(timeout=60)
    assert stat.S_IMODE(cache_home.stat().st_mode) == 0o700 and any(cache_home.iterdir())
    compiled: list[str] = []
    real = jinja2.Environment.compile

    def counted(env, source, name=None, *args, **kwargs):
        compiled.append(name)
        return real(env, source, name, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "compile", counted)
    second = Console(root, Access(TOKEN, loopback=True))  # serve restarted
    assert second.warmed.wait(timeout=60)
    page, _ = second._fleet_html(True, None, "/")
    assert all(f'id="agent-{n}"' in page for n in NAMES)
    assert compiled == [], f"compiled again at the next start: {compiled}"


@pytest.mark.parametrize("kind", ["group-writable", "a link", "a file"])
def test_a_template_folder_another_could_write_is_never_used(cache_home, tmp_path, kind):
    cache_home.parent.mkdir(parents=True)
    if kind == "group-writable":
        cache_home.mkdir(mode=0o700)
        cache_home.chmod(0o770)
    elif kind == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        cache_home.symlink_to(tmp_path / "elsewhere")
    else:
        cache_home.write_text("")
    env = jinja2.Environment(autoescape=True)
    assert template_cache.bytecode_cache(env) is None  # the console's templates then compile as before
    assert template_cache.bytecode_cache(env) is None, "nor is it made usable by a second look"


def test_a_template_compiled_under_other_settings_is_never_loaded(cache_home):
    # the settings name the cache's entries: code compiled with autoescape off (a weakened control,
    # an older version) is another entry, never the one an escaping console loads
    escaping, raw = jinja2.Environment(autoescape=True), jinja2.Environment(autoescape=False)
    assert template_cache.settings(escaping) != template_cache.settings(raw)
    assert template_cache.settings(escaping) == template_cache.settings(jinja2.Environment(autoescape=True))
    for env in (raw, escaping):
        env.loader = jinja2.DictLoader({"t": "{{ x }}"})
        env.bytecode_cache = template_cache.bytecode_cache(env)
        shown = env.get_template("t").render(x="<b>")
        assert shown == ("&lt;b&gt;" if env is escaping else "<b>")


def test_a_view_asked_during_the_warm_up_gets_its_page_not_a_second_pass(root, monkeypatch):
    release, waiting, passes = threading.Event(), threading.Event(), []
    real = Pages.fleet

    def held(pages):  # the warm-up's pass waits until a view is waiting for it
        passes.append(threading.current_thread().name)
        if len(passes) == 1:
            assert release.wait(timeout=30)
        return real(pages)

    class Watched(threading.Event):
        def wait(self, timeout=None):
            waiting.set()
            return super().wait(timeout)

    monkeypatch.setattr(Pages, "fleet", held)
    console = Console(root, Access(TOKEN, loopback=True))
    console._warm_paged = Watched()  # before the warm-up can set it: its pass is held
    listening = start(console, "127.0.0.1", 0)
    got: list[tuple[int, str]] = []
    try:
        view = threading.Thread(target=lambda: got.append(_fleet_view(listening.url)))
        view.start()
        assert waiting.wait(timeout=30), "the view did not wait for the warm-up's page"
        release.set()
        view.join(timeout=30)
        assert console.warmed.wait(timeout=60)
    finally:
        release.set()
        listening.stop()
    status, html = got[0]
    assert status == 200 and all(f'id="agent-{n}"' in html for n in NAMES)
    assert 'action="/logout"' in html, "the page for a person signed in (the view sent the token)"
    assert passes == ["wakeloop-console-warm"], f"passes over the fleet: {passes}"
