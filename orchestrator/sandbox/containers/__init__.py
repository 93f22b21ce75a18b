"""Containers: what runs in a box and how one is made, watched and ended.

The in-box programs (programs.py, their sources in in_box/) and the seccomp
filter, the images, the warm pool, a call's deadline, OOM counts, output
capping, the engine's client (engine_client.py) and a box's attached stream.

May import: nothing of sandbox/ but box.py and changes.py (docs/architecture.md §2).
Not here: the Docker backend that puts a call together (engine.py), the disks (disks/).
"""
