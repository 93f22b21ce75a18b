"""A workspace packed on one node and unpacked on another is the same tree, and a hostile stream
(what a taken-over orchestrator could relay) writes nothing outside the new disk's files/."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from orchestrator.sandbox.disks.workspace_stream import StreamRefused, clear, digest, pack, unpack


def a_workspace(root: Path) -> Path:
    root.mkdir()
    (root / "memory" / "journal").mkdir(parents=True)
    (root / "memory" / "core.md").write_text("# who I am\n")
    (root / "memory" / "journal" / "2026-12-03.md").write_text("woke\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "empty").write_bytes(b"")
    (root / "big.bin").write_bytes(os.urandom(3 * 2**20 + 17))
    (root / "python").symlink_to("/usr/bin/python3")  # an absolute link: resolved in a box, never here
    (root / "notes").symlink_to("memory")
    (root / os.fsdecode(b"caf\xe9.txt")).write_text("not UTF-8 in its name\n")
    return root


def test_a_packed_workspace_unpacks_as_the_same_tree(tmp_path):
    source = a_workspace(tmp_path / "a")
    stream = io.BytesIO()
    sent = pack(source, stream)
    (tmp_path / "b").mkdir()
    landed = unpack(io.BytesIO(stream.getvalue()), tmp_path / "b")
    assert landed == sent == digest(source)
    assert sent.entries == 10
    assert (tmp_path / "b" / "big.bin").read_bytes() == (source / "big.bin").read_bytes()
    assert os.readlink(tmp_path / "b" / "python") == "/usr/bin/python3"
    assert stat.S_IMODE((tmp_path / "b" / "run.sh").stat().st_mode) == 0o755
    (tmp_path / "b" / "memory" / "core.md").write_text("changed\n")
    assert digest(tmp_path / "b") != sent, "the digest must see a file's bytes"


def test_clear_empties_a_folder_without_following_its_links(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    root = a_workspace(tmp_path / "a")
    (root / "away").symlink_to(outside)
    clear(root)
    assert list(root.iterdir()) == []
    assert (outside / "keep").read_text() == "x"


def tar_of(*members: tuple[tarfile.TarInfo, bytes | None]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if data is not None else 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    out.seek(0)
    return out


def member(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


@pytest.mark.parametrize(
    "members, why",
    [
        ([(member("../escaped"), b"x")], "without . or .."),
        ([(member("/tmp/escaped"), b"x")], "relative"),
        ([(member("a/./b"), b"x")], "without . or .."),
        ([(member("out", tarfile.SYMTYPE, link="OUTSIDE"), None), (member("out/escaped"), b"x")], "not a folder"),
        ([(member("dev", tarfile.CHRTYPE), None)], "not a file, folder or link"),
        ([(member("fifo", tarfile.FIFOTYPE), None)], "not a file, folder or link"),
        ([(member("a"), b"x"), (member("hard", tarfile.LNKTYPE, link="a"), None)], "not a file, folder or link"),
        ([(member("a"), b"x"), (member("a"), b"y")], "twice"),
        ([(member("nodir/a"), b"x")], "not a folder"),
    ],
    ids=["dotdot", "absolute", "dot", "through-a-link", "device", "fifo", "hard-link", "twice", "no-parent"],
)
def test_a_hostile_stream_is_refused_and_writes_nothing_outside(tmp_path, members, why):
    outside = tmp_path / "outside"
    outside.mkdir()
    for info, _ in members:
        if info.linkname == "OUTSIDE":
            info.linkname = str(outside)
    root = tmp_path / "files"
    root.mkdir()
    with pytest.raises(StreamRefused, match=why):
        unpack(tar_of(*members), root)
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/escaped").exists()


def test_set_id_bits_and_owners_other_than_root_and_the_disks_in_a_stream_are_not_obeyed(tmp_path):
    root = tmp_path / "files"
    root.mkdir()
    os.chown(root, 1000, 1000)  # the disk's files/: the box's user's
    info = member("tool", mode=0o6755)
    info.uid = info.gid = 4242
    folder = member("shared", tarfile.DIRTYPE, mode=0o1777)
    folder.uid, folder.gid = 0, 4242
    unpack(tar_of((info, b"#!/bin/sh\n"), (folder, None)), root)
    assert stat.S_IMODE((root / "tool").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "shared").stat().st_mode) == 0o777
    assert ((root / "tool").stat().st_uid, (root / "tool").stat().st_gid) == (1000, 1000)
    assert ((root / "shared").stat().st_uid, (root / "shared").stat().st_gid) == (0, 1000)


def test_owners_and_times_cross_a_move_as_the_box_left_them(tmp_path):
    """The agent's folders and files stay the box's user's, an operator's folder stays root's
    (read-only to the box), and every mtime, folders' included, is as it was."""
    source = a_workspace(tmp_path / "a")
    for path in [source, *source.rglob("*")]:
        os.chown(path, 1000, 1000, follow_symlinks=False)
    (source / "operator").mkdir()
    (source / "operator" / "readme.txt").write_text("the operator's\n")
    os.utime(source / "operator", ns=(1_600_000_000_123_456_789,) * 2)
    os.utime(source / "memory" / "journal", ns=(1_500_000_000_000_000_000,) * 2)
    target = tmp_path / "b"
    target.mkdir()
    os.chown(target, 1000, 1000)
    stream = io.BytesIO()
    pack(source, stream)
    unpack(io.BytesIO(stream.getvalue()), target)
    for path in source.rglob("*"):
        was, now = path.lstat(), (target / path.relative_to(source)).lstat()
        assert (now.st_uid, now.st_gid, now.st_mode) == (was.st_uid, was.st_gid, was.st_mode), path
        assert abs(now.st_mtime_ns - was.st_mtime_ns) < 1000, path  # tar's time: a float of seconds
    assert (target / "operator").stat().st_uid == 0


def test_a_stream_that_is_not_a_tar_is_one_line(tmp_path):
    root = tmp_path / "files"
    root.mkdir()
    with pytest.raises(StreamRefused, match="not a workspace's tar stream"):
        unpack(io.BytesIO(b"\x00garbage" * 100), root)
