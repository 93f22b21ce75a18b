"""Disks: an agent's workspace on a filesystem of its own, and the workspace read from the host.

The disk and its holds (disk.py), which folder's it is (disk_index.py), attach
and release (disk_attach.py), the image (disk_image.py), its mounts
(disk_mounts.py, engine_mounts.py), the room guard (disk_room.py), the list
(disk_survey.py), other namespaces' copies (disk_holders.py), the layout of its
root (layers.py), reading and streaming its files (workspace_reads.py,
workspace_stream.py).

May import: containers/ (docs/architecture.md §2).
Not here: a wake's overlay and its commit (wakes/).
"""
