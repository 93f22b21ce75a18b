"""An agent's ordinary life over ten wakes, scripted, checked from inside each next wake.

Each wake's script runs three kinds of call in the box: the ledger script's `verify N-1` (the workspace
is exactly as wake N-1 left it: every path's type, owner, group, mode, mtime, link target
and bytes, from the ledger wake N-1 wrote, and the invariants below), then the wake's work,
then its `snapshot N` (the ledger, kept in .life/ on the workspace; the script is LIFE_SH). The work: folders
made at depth and written into later (bash and write_file), a git repository committed to
in most wakes (`git fsck --strict` clean, `git log` whole), an executable script that runs,
a 0600 file, links to files and folders, renames and deletions of files and folders, 5,000
small files in one wake, a 50 MB file whose sha256 is checked every wake after, a venv, and a
folder the operator made before the first wake (root's, read-only to the agent). After the
tenth wake, `undo` of it must give back wake nine's ledger (owners, modes and bytes: times
are the undo's).

`live_a_life(cli, agent_dir, seen_as)` drives it through any CLI: in process (tests/test_life.py)
or `docker compose exec` (tests/test_compose.py). memory/ is the harness's (the journal stub)
and .life/ holds the ledgers: neither is in a ledger.

Not here: the transaction that must keep all this (orchestrator/sandbox/wakes/transaction.py).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

WAKES = 10
LIFE_POLICY = {"tools": {"write_file": {"protect_git": False}}}  # the agent keeps a git repository
MANY = 5000  # small files made in one wake (wake 3)
BIG_MB = 50  # the big file's size (wake 4)

# The operator's folder: made on the host before the first wake, root's and 0755.
OPERATOR_README = "made by the operator before the first wake\n"

LIFE_SH = r"""#!/bin/bash
# life.sh snapshot N | verify N [--no-times]: the workspace's ledger, written or compared.
set -u
cd /workspace || exit 9
ledger() {  # $1: with times or not
    local fmt='%y %U:%G %m %p -> %l\n'
    [ "$1" = times ] && fmt='%y %U:%G %m %T@ %p -> %l\n'
    find . -mindepth 1 \( -path ./memory -o -path ./.life \) -prune -o -printf "$fmt" | LC_ALL=C sort
    find . -mindepth 1 \( -path ./memory -o -path ./.life \) -prune -o -type f -print0 \
        | LC_ALL=C sort -z | xargs -0 -r sha256sum
}
case "$1" in
snapshot)
    mkdir -p .life && ledger times > ".life/ledger-$2" && ledger plain > ".life/plain-$2" \
        && echo "LIFE-SNAPSHOT $2: $(wc -l < ".life/ledger-$2") lines" ;;
verify)
    kind=times; [ "${3:-}" = --no-times ] && kind=plain
    want=".life/ledger-$2"; [ "$kind" = plain ] && want=".life/plain-$2"
    [ -f "$want" ] || { echo "LIFE-FAIL: no ledger $want"; exit 1; }
    if ! ledger "$kind" | diff "$want" - > /tmp/ledger.diff; then
        echo "LIFE-FAIL: the workspace is not as wake $2 left it:"; head -40 /tmp/ledger.diff; exit 1
    fi
    echo "LIFE-OK: as wake $2 left it ($(wc -l < "$want") lines)" ;;
*) echo "usage: life.sh snapshot N | verify N [--no-times]"; exit 2 ;;
esac
"""

GIT = "git -c user.name=agent -c user.email=agent@example.invalid -c init.defaultBranch=main"


def _commit(message: str) -> str:
    return f"echo '{message}' >> repo/log.txt && {GIT} -C repo add -A && {GIT} -C repo commit -qm '{message}'"


def _bash(*steps: str) -> dict:
    """One bash call: its steps, each needed by the next."""
    return {"name": "bash", "input": {"command": " && ".join(steps)}}


# Each wake's work, after its verify (none before wake 1) and before its snapshot.
WORK: list[list[dict]] = [
    [  # 1: folders, a script, a 0600 file, links, a repository
        _bash(
            "mkdir -p notes/deep/deeper bin",
            "echo a > notes/a.txt",
            "printf '#!/bin/sh\\necho ran\\n' > bin/run.sh",
            "chmod 755 bin/run.sh",
            "echo s > secret.txt",
            "chmod 600 secret.txt",
            "chmod 750 notes/deep",
            "ln -s notes/a.txt link-a",
            "ln -s notes link-notes",
            "touch -d 2020-01-02 notes/a.txt",
            f"{GIT} init -q repo",
            _commit("one"),
        )
    ],
    [  # 2: writes into the folders wake 1 made, by both tools; a rename; a link moved
        _bash(
            "echo b > notes/deep/b.txt",
            "echo c > notes/deep/deeper/c.txt",
            "mv notes/a.txt notes/renamed.txt",
            "ln -sfn notes/renamed.txt link-a",
            _commit("two"),
        ),
        {"name": "write_file", "input": {"path": "notes/deep/deeper/by-write-file.md", "content": "# written\n"}},
    ],
    [  # 3: 5,000 small files in one wake
        _bash(
            "mkdir many",
            "for d in $(seq 0 49); do mkdir many/d$d; done",
            f"for i in $(seq 1 {MANY}); do echo $i > many/d$((i % 50))/f$i; done",
            _commit("three"),
        )
    ],
    [  # 4: a 50 MB file, its sha256 kept aside
        _bash(f"head -c {BIG_MB}M /dev/urandom > big.bin", "mkdir -p .life", "sha256sum big.bin > .life/big.sha256")
    ],
    [  # 5: a folder renamed, folders and a link deleted
        _bash(
            "mv notes/deep notes/moved",
            "rm -rf many/d0 many/d1",
            "rm link-notes",
            "ln -s notes/moved link-moved",
            _commit("four"),
        )
    ],
    [  # 6: modes changed; a venv
        _bash(
            "chmod 700 notes",
            "chmod 640 notes/renamed.txt",
            "chmod 711 bin",
            "python3 -m venv --without-pip venv",
            "venv/bin/python -c 'print(1)'",
        )
    ],
    [  # 7: the venv runs; a file becomes a folder and a folder a file
        _bash(
            "venv/bin/python -c 'print(2)'",
            "rm secret.txt",
            "mkdir secret.txt",
            "echo inner > secret.txt/inner",
            "rm -rf notes/moved/deeper",
            "echo now-a-file > notes/moved/deeper",
            "chmod 600 notes/moved/deeper",
            _commit("five"),
        )
    ],
    [  # 8: git housekeeping rewrites its own files
        _bash(_commit("six"), f"{GIT} -C repo gc -q", f"{GIT} -C repo fsck --strict")
    ],
    [  # 9: the 5,000 files deleted (what is left of them)
        _bash("rm -rf many", "echo more >> notes/renamed.txt")
    ],
    [  # 10: a little of everything, to be undone
        _bash(
            "echo ten >> notes/moved/b.txt",
            "chmod 755 notes",
            "mkdir -p new/deep",
            "echo n > new/deep/n.txt",
            "rm bin/run.sh",
            "printf '#!/bin/sh\\necho ran again\\n' > bin/run.sh",
            "chmod 700 bin/run.sh",
            _commit("seven"),
        )
    ],
]

# What each wake checks beyond the ledger, from the wake after the one that made it true.
COMMITS = [1, 2, 3, 3, 4, 4, 5, 6, 6, 7]  # commits in repo/ at the end of each wake


def _invariants(after_wake: int) -> str:
    checks = [
        "test \"$(cat operator/readme.txt)\" = 'made by the operator before the first wake'",
        "test \"$(stat -c '%U %a' operator)\" = 'root 755'",
        'test "$(bin/run.sh)" = ran',
        f'test "$({GIT} -C repo log --oneline | wc -l)" = {COMMITS[after_wake - 1]}',
        f"{GIT} -C repo fsck --strict --no-progress",
        'test -z "$(git -C repo status --porcelain)"',
    ]
    if after_wake >= 2:
        checks.append('test "$(head -1 notes/renamed.txt)" = a')
    if after_wake < 7:
        checks.append("test \"$(stat -c '%a' secret.txt)\" = 600")
    if after_wake >= 4:
        checks.append("sha256sum --quiet -c .life/big.sha256")
    if 3 <= after_wake < 9:
        checks.append(f'test "$(find many -type f | wc -l)" = {MANY if after_wake < 5 else MANY - 200}')
    if after_wake >= 6:
        checks.append("venv/bin/python -c 'import sys; assert sys.prefix.endswith(\"venv\")'")
    return " && ".join(checks) + " && echo LIFE-INVARIANTS-OK"


def script(wake: int) -> list[dict]:
    """Wake `wake`'s turns: verify (from wake 2), the work, the snapshot, an end."""
    turns: list[dict] = []
    if wake > 1:
        verify = f"bash operator/life.sh verify {wake - 1} && {_invariants(wake - 1)}"
        turns.append(
            {
                "text": f"Checking wake {wake - 1}'s workspace.",
                "tool_calls": [{"name": "bash", "input": {"command": verify}}],
            }
        )
    turns.append({"text": f"Wake {wake}'s work.", "tool_calls": WORK[wake - 1]})
    snapshot = f"bash operator/life.sh snapshot {wake}"
    turns.append({"text": "Keeping the ledger.", "tool_calls": [_bash(snapshot)]})
    turns.append({"text": f"Wake {wake} done."})
    return turns


def prepare(agent_dir: Path) -> None:
    """Before the first wake: the operator's folder (root's, 0755) with the checker in it, and the
    wakes' scripts beside agent.yaml (the harness reads them; the box never sees them)."""
    operator = agent_dir / "workspace" / "operator"
    operator.mkdir(parents=True)
    (operator / "readme.txt").write_text(OPERATOR_README)
    (operator / "life.sh").write_text(LIFE_SH)
    operator.chmod(0o755)
    scripts = agent_dir / "life-scripts"
    scripts.mkdir()
    for wake in range(1, WAKES + 1):
        (scripts / f"{wake}.json").write_text(json.dumps(script(wake)))


def _failed_calls(agent_dir: Path, run_id: str) -> list[str]:
    """Each tool call of the wake that did not exit 0, with its output (the transcript's)."""
    failed = []
    events = [json.loads(line) for line in (agent_dir / "state" / "events.jsonl").read_text().splitlines()]
    for event in events:
        data = event["data"]
        if (
            event["run_id"] == run_id
            and event["type"] == "tool_result"
            and (data.get("exit_code") or data.get("is_error"))
        ):
            failed.append(f"step {data['step']} {data['tool']}: exit {data.get('exit_code')}")
    if failed:
        transcript = (agent_dir / "state" / "transcripts" / f"{run_id}.jsonl").read_text()
        failed.append(transcript[-6000:])
    return failed


Cli = Callable[..., subprocess.CompletedProcess]


def live_a_life(cli: Cli, agent_dir: Path, seen_as: str) -> list[dict]:
    """Ten wakes through `cli` (args -> CompletedProcess; `seen_as` is the agent folder as the
    CLI sees it), each checked; then undo of the last, checked. The receipts."""
    receipts = []
    for wake in range(1, WAKES + 1):
        done = cli("wake", seen_as, "--script", f"{seen_as}/life-scripts/{wake}.json")
        assert done.returncode == 0, f"wake {wake}: exit {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
        receipt = json.loads(done.stdout.strip().splitlines()[-1])
        assert receipt["status"] == "done", f"wake {wake}: {receipt}\n{done.stderr[-4000:]}"
        failed = _failed_calls(agent_dir, receipt["run_id"])
        assert not failed, f"wake {wake}:\n" + "\n".join(failed)
        receipts.append(receipt)
    last = receipts[-1]["run_id"]
    undone = cli("undo", seen_as, "--run", last)
    assert undone.returncode == 0, f"undo: {undone.stdout}\n{undone.stderr}"
    check = cli(
        "sandbox",
        "exec",
        seen_as,
        "--",
        f"bash operator/life.sh verify {WAKES - 1} --no-times && {_invariants(WAKES - 1)}",
    )
    assert check.returncode == 0 and "LIFE-OK" in check.stdout, f"after undo:\n{check.stdout}\n{check.stderr}"
    return receipts
