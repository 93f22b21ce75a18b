"""The wake's transaction: its overlay, its changes checked and committed, undone, diffed.

A wake's overlay mounted and finished (wake_layer.py), scan/check/commit/recover
(transaction.py), the undo folders (undo_folders.py), one wake's diff
(wake_diff.py).

May import: disks/, containers/ (docs/architecture.md §2).
Not here: what a wake changed as every backend returns it (changes.py), the disk's
layout (disks/layers.py).
"""
