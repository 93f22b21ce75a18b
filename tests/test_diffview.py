"""One wake's diff as a person reads it (views/diffview.py): right, and quick on any text file."""

from __future__ import annotations

import random
import time

import pytest

from orchestrator.sandbox.changes import Change
from orchestrator.sandbox.wakes.wake_diff import PathDiff, Side, WakeDiff
from orchestrator.views import diffview

LINES = 10_000  # 30 bytes each: a 300 KB side, over the 250 KB the issue timed
WORDS = [f"line {i} " + "x" * 20 for i in range(150)]  # few distinct lines: difflib's worst case


def _scattered(seed: int) -> tuple[str, str, list[str]]:
    """A long text and the same with every seventh line changed: (before, after, the new lines)."""
    rng = random.Random(seed)
    old = [rng.choice(WORDS) for _ in range(LINES)]
    new = list(old)
    changed = []
    for i in range(0, LINES, 7):
        new[i] = f"changed {seed} {i}"
        changed.append(new[i])
    return "\n".join(old) + "\n", "\n".join(new) + "\n", changed


def _modified(path: str, before: str, after: str) -> PathDiff:
    change = Change(path, "modified", "file", len(after), 0o644)
    return PathDiff(
        change,
        Side("file", len(before), 0o644, sha256="a" * 64, text=before),
        Side("file", len(after), 0o644, sha256="b" * 64, text=after),
    )


@pytest.mark.serial  # a wall-clock bound: alone, not beside another worker
def test_four_long_files_changed_in_many_places_diff_whole_and_quickly():
    """Four 300 KB files with 1,429 lines changed each: difflib took 34 s a file; the bound is 20 s in all."""
    sides = [_scattered(seed) for seed in range(4)]
    diff = WakeDiff(
        "0123456789ab", "committed", 0.0, tuple(_modified(f"f{n}.txt", b, a) for n, (b, a, _) in enumerate(sides))
    )
    began = time.monotonic()
    lines = diffview.render(diff)
    took = time.monotonic() - began
    added = {line.text[1:] for line in lines if line.kind == "add"}
    for _before, _after, changed in sides:
        assert set(changed) <= added
    assert sum(line.kind == "del" for line in lines) == sum(len(c) for *_, c in sides)
    assert took < 20, f"four long files took {took:.1f} s to diff"


def test_a_diff_past_its_bound_says_so_and_shows_the_file_by_size(monkeypatch):
    monkeypatch.setattr(diffview, "DIFF_TIMEOUT_S", 1e-6)
    before, after, _ = _scattered(7)
    text = diffview.render_text(WakeDiff("0123456789ab", "committed", 0.0, (_modified("big.txt", before, after),)))
    assert "--- a/big.txt" in text and "+++ b/big.txt" in text
    assert "changed in too many places to diff within" in text
    assert f"{len(after):,} bytes, sha256 {'b' * 64}" in text  # shown by size and hash, not by its lines
    assert "changed 7 0" not in text


def test_a_deleted_line_that_starts_with_dashes_is_a_deletion_not_a_header():
    diff = WakeDiff("0123456789ab", "committed", 0.0, (_modified("notes.md", "keep\n-- rule\n", "keep\n"),))
    kinds = {line.text: line.kind for line in diffview.render(diff)}
    assert kinds["--- a/notes.md"] == "head"
    assert kinds["--- rule"] == "del"
