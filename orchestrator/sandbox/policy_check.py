"""Whether the live engine can give what a policy asks, before any container starts.

A policy file is checked on its own when it is read (policy/load.py: pure, no
engine). What only the engine knows is checked here: the image is on it, the
runtime is registered, that runtime can give the policy's network, gVisor gets
pids enough, the engine has the cpus. Each refusal names `file:line: key`, as
the policy's own errors do, so a person fixes the line it names.

Not here: the policy's own checks (policy/load.py), whether the image is
stale (engine.py's check_image), running anything.
"""

from __future__ import annotations

import docker

from orchestrator.policy.schema import Policy, PolicyError

# Under gVisor the pids limit counts the Sentry's host threads too: below ~56 a
# box cannot start, below 128 a few background jobs kill it (measured, runsc 2022-12).
RUNSC_MIN_PIDS = 128


def check_against_engine(policy: Policy, client: docker.DockerClient) -> None:
    """Raise PolicyError if the live engine lacks the policy's image or runtime,
    cannot give its cpus, or has a runtime that cannot give its network.
    Call before any container starts."""
    box = policy.sandbox
    try:
        info = client.info()
        client.images.get(box.image)
        has_image = True
    except Exception as exc:  # docker.errors.ImageNotFound, or an engine error
        if type(exc).__name__ != "ImageNotFound":
            raise PolicyError(f"{policy.source}: cannot ask the Docker engine: {exc}") from None
        has_image = False
    if not has_image:
        raise PolicyError(
            f"{policy.where('sandbox.image')}: sandbox.image: {box.image} is not on this "
            "engine; build it with `wakeloop image build` or name an image it has"
        )
    runtimes = info.get("Runtimes") or {}
    if box.runtime not in runtimes:
        hint = " (run scripts/setup-runsc.sh to install gVisor)" if box.runtime == "runsc" else ""
        raise PolicyError(
            f"{policy.where('sandbox.runtime')}: sandbox.runtime: the engine has no runtime "
            f"{box.runtime!r} (it has: {', '.join(sorted(runtimes))}){hint}"
        )
    args = (runtimes[box.runtime] or {}).get("runtimeArgs") or []
    if box.network != "none" and "--network=none" in args:
        raise PolicyError(
            f"{policy.where('sandbox.network')}: sandbox.network: runtime {box.runtime} is "
            f"registered with --network=none, so network: {box.network} cannot work under "
            "it; use runtime runc, or network: none"
        )
    if "runsc" in str((runtimes[box.runtime] or {}).get("path", "")) and box.pids < RUNSC_MIN_PIDS:
        raise PolicyError(
            f"{policy.where('sandbox.pids')}: sandbox.pids: {box.pids} is too few under "
            f"gVisor, whose own threads count against the limit; use at least "
            f"{RUNSC_MIN_PIDS}"
        )
    ncpu = info.get("NCPU") or 0
    if ncpu and box.cpus > ncpu:
        raise PolicyError(
            f"{policy.where('sandbox.cpus')}: sandbox.cpus: {box.cpus} is more than the {ncpu} CPUs this engine has"
        )
