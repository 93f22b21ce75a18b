"""How fast this engine serves sandbox calls when nothing is made ahead: its own limit.

A fleet on one host is bound by how many containers a second the engine can
create, start and remove; no pool makes that faster, it only moves the work
ahead of the call. So the rate is measured, not assumed: `calls` cold calls
of `true` (create, attach, start, wait, remove: DockerSandbox with no pool),
`parallel` at a time, from exactly the settings the policy gives a call, on a
scratch folder (bind-mounted, as `sandbox.disk: none` is: attaching a disk is
a wake's start, not a call). `serve` uses it to choose how many wakes run at
once (fleet/capacity.py); the fleet bench, for the engine-bound time.

Not here: choosing the concurrency (fleet/capacity.py), the pool (pool.py).
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import docker

from orchestrator.policy.schema import SandboxPolicy
from orchestrator.sandbox.box import SandboxError
from orchestrator.sandbox.engine import DockerSandbox

CALL_TIMEOUT_S = 60  # one `true`; only an engine far past its limit takes this long


@dataclass(frozen=True)
class Rate:
    calls: int
    parallel: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else 0.0

    @property
    def latency_s(self) -> float:
        """One call's time, start to removal, at this rate (`parallel` were in flight)."""
        return self.seconds * self.parallel / self.calls if self.calls else 0.0


def measure(
    client: docker.DockerClient,
    policy: SandboxPolicy,
    calls: int,
    parallel: int,
    under: tuple[Path, Path] | None = None,
) -> Rate:
    """Cold calls of `true` under `policy`'s settings, `parallel` at once; SandboxError if one fails.
    `under`: (a folder, its path on the engine's host) for the scratch folder, when this process
    runs in a container (the broker): its own /tmp is no path the engine can bind."""
    with tempfile.TemporaryDirectory(prefix=".wakeloop-rate-", dir=under[0] if under else None) as scratch:
        cold = replace(policy, disk=0, pool=0, network="none", allow_hosts=())
        host_path = under[1] / Path(scratch).name if under else None
        box = DockerSandbox(Path(scratch), cold, agent="rate", client=client, host_path=host_path)
        left, lock, failed = [calls], threading.Lock(), list[str]()

        def worker() -> None:
            while True:
                with lock:
                    if left[0] <= 0 or failed:
                        return
                    left[0] -= 1
                try:
                    result = box.run("true", timeout_s=CALL_TIMEOUT_S, max_output_chars=1000)
                except SandboxError as exc:  # not raised in the thread: a call that never ran is no rate
                    failed.append(str(exc).splitlines()[0])
                    return
                if not result.ok:
                    failed.append(result.for_model().splitlines()[0])

        started = time.perf_counter()
        threads = [threading.Thread(target=worker, name="wakeloop-rate") for _ in range(max(1, parallel))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        box.close()
    if failed:
        raise SandboxError(f"measuring the engine's rate: a call of `true` failed: {failed[0]}")
    return Rate(calls, parallel, elapsed)
