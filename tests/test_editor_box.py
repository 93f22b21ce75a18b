"""The text editor's and the memory tool's program in a real box (sandbox/containers/in_box/edit.py), on both runtimes:
each command, its documented errors, and the refusals write_file makes (links, FIFOs, sizes, paths)."""

from __future__ import annotations

import os

import pytest

from orchestrator.policy.editor_paths import EDITOR, MEMORY

MAX = 1_048_576


def edit(sandbox, args, tool=EDITOR, max_bytes=MAX, max_chars=20_000):
    return sandbox.edit(tool, args, timeout_s=30, max_bytes=max_bytes, max_chars=max_chars)


def put(agent, rel, text):
    path = agent.workspace / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chown(path, 1000, 1000)  # as the agent would have made it
    return path


def test_view_numbers_lines_and_honours_view_range(sandbox, agent):
    put(agent, "notes.md", "one\ntwo\nthree\nfour\n")
    whole = edit(sandbox, {"command": "view", "path": "/workspace/notes.md"})
    assert whole.exit_code == 0, whole.output
    assert "     1\tone\n     2\ttwo\n     3\tthree\n     4\tfour" in whole.output
    part = edit(sandbox, {"command": "view", "path": "notes.md", "view_range": [2, 3]})
    assert "     2\ttwo\n     3\tthree" in part.output and "one" not in part.output and "four" not in part.output
    to_end = edit(sandbox, {"command": "view", "path": "notes.md", "view_range": [3, -1]})
    assert "three" in to_end.output and "four" in to_end.output and "two" not in to_end.output
    bad = edit(sandbox, {"command": "view", "path": "notes.md", "view_range": [3, 9]})
    assert bad.exit_code == 1 and "Invalid `view_range`" in bad.output


def test_view_of_a_large_file_is_cut_at_max_characters_and_says_so(sandbox, agent):
    put(agent, "big.txt", "".join(f"line {i}\n" for i in range(50_000)))
    result = edit(sandbox, {"command": "view", "path": "big.txt"}, max_chars=5_000)
    assert result.exit_code == 0 and not result.truncated
    assert len(result.output) < 5_300 and "max_characters" in result.output and "50,000 lines" in result.output


def test_view_of_a_file_past_max_bytes_reads_only_its_head_and_says_so(sandbox, agent):
    put(agent, "huge.txt", "x" * 99 + "\n" * 1 + "y\n" * 200_000)
    result = edit(sandbox, {"command": "view", "path": "huge.txt"}, max_bytes=4096, max_chars=100_000)
    assert result.exit_code == 0 and "only its first 4,096 bytes were read" in result.output


def test_view_of_a_binary_file_says_so_and_shows_none_of_it(sandbox, agent):
    (agent.workspace / "blob.bin").write_bytes(b"\x7fELF\0\0\0secret-ish" * 100)
    result = edit(sandbox, {"command": "view", "path": "blob.bin"})
    assert result.exit_code == 1 and "binary file" in result.output and "secret-ish" not in result.output


def test_view_of_a_folder_lists_two_levels_without_hidden_items(sandbox, agent):
    put(agent, "src/a/b/c.py", "x")
    put(agent, "src/.hidden", "x")
    result = edit(sandbox, {"command": "view", "path": "/workspace/src"})
    assert result.exit_code == 0, result.output
    assert "/workspace/src/a/\n" in result.output and "/workspace/src/a/b/" in result.output
    assert "c.py" not in result.output and ".hidden" not in result.output


def test_str_replace_changes_the_one_match(sandbox, agent):
    path = put(agent, "f.py", "a = 1\nb = 2\nc = 3\n")
    result = edit(sandbox, {"command": "str_replace", "path": "f.py", "old_str": "b = 2", "new_str": "b = 20"})
    assert result.exit_code == 0, result.output
    assert path.read_text() == "a = 1\nb = 20\nc = 3\n"
    assert "has been edited" in result.output and "     2\tb = 20" in result.output


@pytest.mark.parametrize(
    "text,wanted", [("a\nb\n", "No match found for replacement"), ("x\nx\n", "Found 2 matches for replacement text")]
)
def test_str_replace_without_exactly_one_match_answers_the_documented_error_and_changes_nothing(
    sandbox, agent, text, wanted
):
    path = put(agent, "f.txt", text)
    result = edit(sandbox, {"command": "str_replace", "path": "f.txt", "old_str": "x", "new_str": "y"})
    assert result.exit_code == 1 and wanted in result.output
    assert path.read_text() == text


def test_create_makes_parents_and_insert_adds_lines_where_asked(sandbox, agent):
    made = edit(sandbox, {"command": "create", "path": "deep/er/new.md", "file_text": "one\nthree\n"})
    assert made.exit_code == 0, made.output
    result = edit(sandbox, {"command": "insert", "path": "deep/er/new.md", "insert_line": 1, "insert_text": "two"})
    assert result.exit_code == 0, result.output
    assert (agent.workspace / "deep/er/new.md").read_text() == "one\ntwo\nthree\n"
    at_top = edit(sandbox, {"command": "insert", "path": "deep/er/new.md", "insert_line": 0, "insert_text": "zero\n"})
    assert at_top.exit_code == 0
    assert (agent.workspace / "deep/er/new.md").read_text() == "zero\none\ntwo\nthree\n"


def test_insert_past_the_end_is_refused_and_changes_nothing(sandbox, agent):
    path = put(agent, "f.txt", "a\nb\n")
    result = edit(sandbox, {"command": "insert", "path": "f.txt", "insert_line": 3, "insert_text": "c"})
    assert result.exit_code == 1 and "Invalid `insert_line` parameter: 3" in result.output and "[0, 2]" in result.output
    assert path.read_text() == "a\nb\n"


def test_an_edit_through_a_symlink_or_to_a_fifo_is_refused_and_leaves_the_host_untouched(sandbox, agent, tmp_path):
    outside = tmp_path / "host-file"
    outside.write_text("host original\n")
    os.chmod(outside, 0o666)  # writable by anyone: only not following the link protects it
    (agent.workspace / "escape").symlink_to(outside)
    (agent.workspace / "dirlink").symlink_to(tmp_path)
    os.mkfifo(agent.workspace / "pipe")
    os.chown(agent.workspace / "pipe", 1000, 1000)
    for args in (
        {"command": "view", "path": "escape"},
        {"command": "view", "path": "dirlink/host-file"},
        {"command": "str_replace", "path": "escape", "old_str": "host", "new_str": "pwned"},
        {"command": "insert", "path": "dirlink/host-file", "insert_line": 0, "insert_text": "pwned"},
        {"command": "create", "path": "dirlink/new-file", "file_text": "pwned"},
        {"command": "create", "path": "escape", "file_text": "pwned"},
        {"command": "view", "path": "pipe"},
        {"command": "str_replace", "path": "pipe", "old_str": "a", "new_str": "b"},
    ):
        result = edit(sandbox, args)
        assert result.exit_code == 3 and "refused" in result.output and not result.timed_out, (args, result.output)
    assert outside.read_text() == "host original\n"
    assert not (tmp_path / "new-file").exists()


@pytest.mark.parametrize(
    "path", ["../x", "/etc/passwd", "a/../../x", "/workspace/../etc/passwd", "/proc/self/environ", "a\nb", ""]
)
def test_path_tricks_are_refused_before_any_container(sandbox, path):
    result = edit(sandbox, {"command": "view", "path": path})
    assert result.exit_code == 2 and result.container_id == "", result.output


def test_an_edit_past_max_bytes_is_refused_and_changes_nothing(sandbox, agent):
    path = put(agent, "f.txt", "x" * 100 + "\nKEY\n")
    args = {"command": "str_replace", "path": "f.txt", "old_str": "KEY", "new_str": "y" * 200}
    result = edit(sandbox, args, max_bytes=150)
    assert result.exit_code == 3 and "max_bytes" in result.output
    assert path.read_text() == "x" * 100 + "\nKEY\n"


def test_memory_commands_stay_in_the_memory_folder(sandbox, agent):
    def mem(args):
        return edit(sandbox, args, tool=MEMORY)

    assert mem({"command": "create", "path": "/memories/notes/a.md", "file_text": "fact 1\n"}).exit_code == 0
    assert (agent.workspace / "memory/notes/a.md").read_text() == "fact 1\n"
    assert (
        mem({"command": "str_replace", "path": "/memories/notes/a.md", "old_str": "1", "new_str": "2"}).exit_code == 0
    )
    assert mem({"command": "rename", "old_path": "/memories/notes/a.md", "new_path": "/memories/b.md"}).exit_code == 0
    assert (agent.workspace / "memory/b.md").read_text() == "fact 2\n"
    listing = mem({"command": "view", "path": "/memories"})
    assert "/memories/b.md" in listing.output and "/memories/core.md" in listing.output, listing.output
    assert mem({"command": "delete", "path": "/memories/notes"}).exit_code == 0
    assert not (agent.workspace / "memory/notes").exists()
    for args in (
        {"command": "view", "path": "/workspace/mandate.md"},
        {"command": "create", "path": "/memories/../escape.md", "file_text": "x"},
        {"command": "rename", "old_path": "/memories/b.md", "new_path": "/tmp/b.md"},
        {"command": "delete", "path": "/memories"},
        {"command": "view", "path": "memories/b.md"},
    ):
        result = mem(args)
        assert result.exit_code != 0, (args, result.output)
    assert (agent.workspace / "memory/b.md").exists() and not (agent.workspace / "escape.md").exists()
