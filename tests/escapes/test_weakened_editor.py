"""The escape probes of Claude's file tools (orchestrator/escapes/editor_probes.py) can fail: each reports
ESCAPED against a text editor and memory tool done as a naive harness would do them, on the host, through
the workspace folder, following whatever the path names (a design we rejected, as WritesFromTheHost in
test_weakened.py is for write_file); and editor_refuses_symlinks against the box's own program with its
check of what it opened switched off, on gVisor, which follows a link O_NOFOLLOW | O_DIRECTORY names.
Weakened boxes exist only here; product code never builds one."""

from __future__ import annotations

import os

import pytest

from orchestrator.escapes import ESCAPED, by_name
from orchestrator.escapes.lab import run_probe
from orchestrator.policy.editor_paths import MEMORY
from orchestrator.sandbox import engine
from orchestrator.sandbox.box import SandboxResult
from orchestrator.sandbox.containers import programs
from orchestrator.sandbox.engine import DockerSandbox

COVERED = {
    "editor_refuses_path_tricks",
    "editor_refuses_symlinks",
    "editor_survives_symlink_swap",
    "editor_bounds_huge_view",
    "editor_refuses_insert_past_end",
}


class EditsFromTheHost(DockerSandbox):
    """Each edit done by the harness on the host: the model's path joined to the workspace folder,
    opened as it comes (links followed, `..` kept), no range or size checked."""

    def edit(self, tool, args, timeout_s, max_bytes, max_chars, protect_git=True):
        key = "path" if args.get("command") != "rename" else "old_path"
        path = str(args.get(key, ""))
        rel = path.replace("/memories", "memory", 1) if tool == MEMORY else path.removeprefix("/workspace/")
        target = self.view / rel
        try:
            return self._naive(args, target)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return _result(1, str(exc))

    def _naive(self, args, target):
        command = args["command"]
        if command == "view":
            return _result(0, _read(target))
        if command == "create":
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(args.get("file_text", ""))
        elif command == "str_replace":
            target.write_text(_read(target).replace(args["old_str"], args.get("new_str", ""), 1))
        elif command == "insert":
            lines = _read(target).splitlines(keepends=True)
            lines.insert(args["insert_line"], args["insert_text"] + "\n")
            target.write_text("".join(lines))
        elif command == "delete":
            target.unlink()
        elif command == "rename":
            target.rename(self.view / args["new_path"].replace("/memories", "memory", 1))
        return _result(0, "done")


def _read(target) -> str:
    """The file's text, links followed; O_NONBLOCK only so that a planted FIFO cannot hang the test."""
    fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
    try:  # a folder opens too, then fails to read: closed all the same (its mount must come off)
        data = b""
        while chunk := os.read(fd, 1 << 20):
            data += chunk
        return data.decode("utf-8", "replace")
    finally:
        os.close(fd)


def _result(code: int, output: str) -> SandboxResult:
    return SandboxResult(code, output, len(output), False, False, False, 0, "host")


@pytest.mark.parametrize("probe_name", sorted(COVERED))
def test_each_editor_probe_escapes_edits_done_on_the_host(probe_name, make_lab):
    outcome = run_probe(make_lab(sandbox_class=EditsFromTheHost), by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"{probe_name} said {outcome.verdict}: {outcome.observed}"


@pytest.mark.parametrize("runtime", ["runsc"], indirect=True)  # runc refuses the link itself (O_NOFOLLOW)
def test_the_symlink_probe_escapes_the_edit_program_without_its_check_under_gvisor(make_lab, runtime, monkeypatch):
    """Only gVisor follows a link named with O_NOFOLLOW | O_DIRECTORY, so only there is the check the defence."""
    check = "if not _same(fd, part, sub):"
    assert check in programs.EDIT_SCRIPT
    weak = programs.EDIT_SCRIPT.replace(check, "if False:")
    monkeypatch.setattr(engine, "edit_argv", lambda: [programs.PYTHON, "-I", "-c", weak])
    outcome = run_probe(make_lab(), by_name("editor_refuses_symlinks"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
