"""The box: every tool call in a fresh, hardened, disposable container.

At the top, the interface and what puts the rooms together: box.py (the
Sandbox protocol every backend meets, SandboxResult, SandboxError, Files),
changes.py (what a wake changed: Change, WakeChanges, Settled), engine.py
(the Docker backend: container settings, one call start to removal),
rate.py (the engine's measured rate), explain.py (the settings of each call
as `docker run` flags), policy_check.py (whether the engine has what a
policy asks: image, runtime, cpus). Then four rooms, each a sub-package:

- containers/: what runs in a box and how one is made and watched (the
  in-box programs and their seccomp filter, images, the warm pool, a call's
  deadline, OOM counts, output capping, the engine's client);
- disks/: an agent's disk (made, attached, mounted, released, listed, the
  guard that keeps the host's room) and its files read from the host;
- wakes/: the wake's transaction (its overlay, its changes checked,
  committed, undone, diffed);
- egress/: the allowlist network and its proxy, a sandbox's empty network
  namespace.

Imports policy/ and records/ at most; never broker/, wake/ or fleet/. Inside,
each room imports only the rooms below it (docs/architecture.md §2).
"""
