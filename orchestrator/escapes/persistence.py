"""Persistence attacks: keep something alive or changed from one call to the
next — a file outside /workspace, a background process, a container, a planted
binary or shell startup file that the next call would run.
"""

from __future__ import annotations

import os
import secrets
import time

from orchestrator.escapes.lab import Probe, Trial, escaped, held

CATEGORY = "persistence"
TEARDOWN_S = 5  # seconds the engine gets to tear down a finished box before a survivor counts


def _forgets_files_outside_workspace(t: Trial) -> str:
    token = secrets.token_hex(6)
    places = ["/tmp", "/dev/shm", "/var/tmp", "/run/lock", "/dev/mqueue"]
    plant = "; ".join(f"echo {token} > {p}/persist 2>/dev/null" for p in places)
    t.run(plant)
    out = t.sh("grep -ls " + token + " " + " ".join(f"{p}/persist" for p in places) + "; echo CHECKED")
    kept = [ln for ln in out.splitlines() if ln.endswith("/persist")]
    if kept:
        return escaped(f"survived into the next call: {kept}")
    if "CHECKED" not in out:
        return out
    return held("files written to /tmp, /dev/shm, /var/tmp, /run/lock were gone in the next call")


forgets_files_outside_workspace = Probe(
    "forgets_files_outside_workspace",
    CATEGORY,
    "nothing written outside /workspace reaches the next call",
    _forgets_files_outside_workspace,
)


def _kills_background_processes(t: Trial) -> str:
    """Leave processes behind three ways; afterwards no host process may carry the token."""
    token = "wakeloop-bg-" + secrets.token_hex(6)
    attack = (
        f"(exec -a {token} sleep 600) & disown; "
        f"setsid bash -c 'exec -a {token} sleep 600' </dev/null >/dev/null 2>&1 & "
        f"nohup bash -c '(exec -a {token} sleep 600) & exec -a {token} sleep 600' >/dev/null 2>&1 & "
        "sleep 0.5; echo planted"
    )
    result = t.run(attack, timeout_s=20)
    # The box's init exits with the call and the kernel reaps its pid namespace;
    # allow that teardown a bounded moment, nothing more.
    end = time.monotonic() + TEARDOWN_S
    while (survivors := _host_processes_with(token)) and time.monotonic() < end:
        time.sleep(0.1)
    if survivors:
        return escaped(f"{len(survivors)} process(es) outlived the call on the host: pids {survivors[:5]}")
    if "planted" not in result.output:
        return result.output
    return held(
        f"the call returned in {result.duration_ms / 1000:.1f} s; no process carrying the token survives on the host"
    )


def _host_processes_with(token: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if token.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


kills_background_processes = Probe(
    "kills_background_processes",
    CATEGORY,
    "background, disowned, setsid and nohup processes die with the call (none left on the host)",
    _kills_background_processes,
)


def _leaves_no_container_behind(t: Trial) -> str:
    """Calls that end every way (success, failure, timeout, OOM); then count the
    containers the engine still has for this workspace."""
    t.run("true")
    t.run("exit 3")
    t.run("sleep 60", timeout_s=2)
    t.run("python3 -c 'b = bytearray(1 << 40)'", timeout_s=20)
    t.box.write("memory/x.md", b"x")
    left = t.containers_left()
    if left:
        return escaped(f"{len(left)} container(s) left after their calls: {[c.short_id for c in left]}")
    return held("after success, failure, timeout, out-of-memory and a write: no container left")


leaves_no_container_behind = Probe(
    "leaves_no_container_behind",
    CATEGORY,
    "every call's container is removed, however the call ended",
    _leaves_no_container_behind,
)


def _workspace_cannot_hijack_commands(t: Trial) -> str:
    """Plant executables, shell startup files and Python modules in the workspace
    (the next call's cwd); the next call's commands and write_file's own python3
    must be the image's. (A planted module imported by the agent's *own* python is
    the agent attacking itself, not the harness: not checked.)"""
    fake = "#!/bin/sh\necho ESCAPED: planted $0 ran\n"
    plant = {name: fake for name in ("ls", "python3", "bash", "cat", "sh", "env")}
    plant.update(
        {
            ".bashrc": "echo ESCAPED: .bashrc ran\n",
            ".profile": "echo ESCAPED: .profile ran\n",
            ".bash_profile": "echo ESCAPED: .bash_profile ran\n",
            "sitecustomize.py": "print('ESCAPED: sitecustomize ran')\n",
            "os.py": "print('ESCAPED: a planted os.py was imported')\n",
        }
    )
    for name, text in plant.items():
        path = t.workspace / name
        path.write_text(text)
        path.chmod(0o755)
        os.chown(path, *_owner(t.workspace))
    out = t.sh("ls >/dev/null; cat /dev/null; env >/dev/null; echo NEXT-CALL-RAN")
    write = t.box.write("memory/after.md", b"ok")
    if "ESCAPED" in out or "ESCAPED" in write.output:
        return out + write.output
    if "NEXT-CALL-RAN" not in out:
        return out
    return held("planted ls/python3/bash/.bashrc/os.py in /workspace: the next call ran the image's own")


def _owner(path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_uid, st.st_gid


workspace_cannot_hijack_commands = Probe(
    "workspace_cannot_hijack_commands",
    CATEGORY,
    "binaries, .bashrc or Python modules planted in /workspace do not run in later calls",
    _workspace_cannot_hijack_commands,
)

PROBES = [
    forgets_files_outside_workspace,
    kills_background_processes,
    leaves_no_container_behind,
    workspace_cannot_hijack_commands,
]
