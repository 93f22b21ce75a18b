"""Attacks on a disk the engine mounts itself (sandbox/disks/engine_mounts.py): what a broker in
a container uses where the host's `/` is a private mount, as under `docker compose up`
on these machines.

The box binds files/ from the engine's own mount of the disk, kept by a keeper container,
and a wake's boxes mount the wake's overlay as an engine volume. So the same promises are
attacked again on these mounts: the box sees the agent's files and nothing of the disk's
own (lost+found, .wakeloop/ with every wake's layers and undo data), outside a wake and
inside one; and the transaction probes (protected paths by bash, links across the layers,
set-id bits at commit) hold when the engine, not wakeloop, mounts the overlay and the
commit must first take it from every box.

Not here: the probes on wakeloop's own mounts (transaction_probes.py), the mounts
themselves (engine_mounts.py).
"""

from __future__ import annotations

from functools import partial

from orchestrator.escapes.core import PROBE_TIMEOUT_S, Probe, Trial, escaped, held, observed
from orchestrator.escapes.transaction_probes import (
    RUN,
    _links_across_layers,
    _protected_paths_by_bash,
    _setid_at_commit,
)
from orchestrator.sandbox.disks import layers

CATEGORY = "workspace"
LOOK = (  # what /workspace lists; what of the disk's own is reachable anywhere; what `find` may not read
    "ls -A /workspace; echo ==; find / -xdev -maxdepth 6 \\( -name .wakeloop -o -name lost+found "
    "-o -name upper \\) 2>/dev/null; echo ==; find /workspace -maxdepth 3 2>&1 | grep -c 'Permission denied'"
)
DISK_OWN = (".wakeloop", "lost+found", layers.STAGING)


def _only_its_files(t: Trial) -> str:
    box = t.new_box(warm=0, engine_mounts=True)
    if box.disk_root is None:
        return "no disk here (sandbox.disk none): nothing the engine mounts\n"
    (layers.files(box.disk_root) / "notes.md").write_text("mine\n")
    outside = observed(box.run(LOOK, timeout_s=PROBE_TIMEOUT_S, max_output_chars=8000))
    box.begin(RUN)
    inside = observed(box.run(LOOK, timeout_s=PROBE_TIMEOUT_S, max_output_chars=8000))
    box.finish()
    for when, seen in (("outside a wake", outside), ("inside a wake", inside)):
        listed, reached, denied = (seen.split("==") + ["", ""])[:3]
        own = [name for name in DISK_OWN if name in listed.split()]
        if own:
            return escaped(f"the box sees the disk's own {own} {when}: {listed.split()[:8]}")
        if reached.strip():
            return escaped(f"the box reaches the disk's own folders {when}: {reached.split()[:4]}")
        if "notes.md" not in listed.split():
            return f"the box did not see the agent's files {when}: {seen[-300:]}\n"
        count = denied.split()[0] if denied.split() else "?"  # then observed()'s [host: exit N]
        if count != "0":
            return escaped(f"`find /workspace` {when} meets folders it may not read: {count} 'Permission denied'")
    return held(
        "outside a wake and inside one, /workspace lists the agent's files only (no lost+found, .wakeloop or "
        "layer), `find` meets no 'Permission denied', and no .wakeloop is reachable from the box"
    )


engine_mounts_show_a_box_only_its_files = Probe(
    "engine_mounts_show_a_box_only_its_files",
    CATEGORY,
    "where the engine mounts the disk itself, a box sees the agent's files and nothing of the disk's own "
    "(lost+found, .wakeloop/ with every wake's layers), outside a wake and inside one",
    _only_its_files,
)

engine_mounts_refuse_protected_paths_by_bash = Probe(
    "engine_mounts_refuse_protected_paths_by_bash",
    CATEGORY,
    "where the engine mounts the wake's overlay, a change to a workspace.protect path by bash (a write, "
    "`mv`, rename(2) of a folder into place, a hard link) is refused at finish all the same",
    partial(_protected_paths_by_bash, engine_mounts=True),
)

engine_mounts_never_follow_links_across_layers = Probe(
    "engine_mounts_never_follow_links_across_layers",
    CATEGORY,
    "where the engine mounts the wake's overlay, links the wake plants land as links, never followed",
    partial(_links_across_layers, engine_mounts=True),
)

engine_mounts_refuse_setid_bits_at_commit = Probe(
    "engine_mounts_refuse_setid_bits_at_commit",
    CATEGORY,
    "where the engine mounts the wake's overlay, no set-id file lands at the wake's commit",
    partial(_setid_at_commit, engine_mounts=True),
)

PROBES = [
    engine_mounts_show_a_box_only_its_files,
    engine_mounts_refuse_protected_paths_by_bash,
    engine_mounts_never_follow_links_across_layers,
    engine_mounts_refuse_setid_bits_at_commit,
]
