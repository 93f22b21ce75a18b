"""What the allowlist's proxy costs: its start, its memory, and each request through it.

    .venv/bin/python -m bench.egress_proxy [--n 20] [--starts 3]

Starts: `network.ensure` for a fresh agent (its internal network, netns holder and proxy;
the image already built), `--starts` times. Memory: the proxy container's usage after
start and after the requests. Requests: from inside one box, `--n` HTTPS GETs each with
its own connection (urllib, a new TLS handshake every time) to one of our own HTTPS
servers (escapes/credentials.py's ECHO_SERVER) by a tunnelled name, and by an
intercepted name with a credential (the proxy ends TLS, checks rules, sets the header,
opens its own TLS upstream): medians side by side, timed inside the box.

Not here: what the box itself costs per call (per_call.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import docker

from bench.common import say, stats
from orchestrator.escapes.credentials import echo_server
from orchestrator.policy.schema import Credential, HttpRule, SandboxPolicy
from orchestrator.sandbox.egress import egress_plan, network
from orchestrator.sandbox.engine import DockerSandbox

TUNNELLED, INTERCEPTED = "tunnelled.wakeloop-bench.test", "intercepted.wakeloop-bench.test"
VAR = "BENCH_EGRESS_TOKEN"

# In the box: n GETs to each URL, each its own connection; prints the per-request seconds.
TIMER = r"""
import json, ssl, sys, time, urllib.request
n, urls = int(sys.argv[1]), sys.argv[2:]
loose = ssl.create_default_context(); loose.check_hostname = False; loose.verify_mode = ssl.CERT_NONE
out = {}
for url in urls:
    ctx = loose if "tunnelled" in url else ssl.create_default_context(cafile="/tmp/wakeloop-ca.pem")
    times = []
    for i in range(n):
        t = time.perf_counter()
        urllib.request.urlopen(url, context=ctx, timeout=20).read()
        times.append(time.perf_counter() - t)
    out[url] = times
print(json.dumps(out))
"""


def _policy() -> SandboxPolicy:
    return replace(
        SandboxPolicy(),
        network="allowlist",
        disk=0,
        pool=0,
        allow_hosts=(TUNNELLED, INTERCEPTED),
        credentials=(Credential(host=INTERCEPTED, value=f"Bearer ${{{VAR}}}"),),
        http=(HttpRule(host=INTERCEPTED, allow=("GET /**",)),),
    )


def _memory(client, name: str) -> float:
    return client.containers.get(name).stats(stream=False)["memory_stats"].get("usage", 0) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.egress_proxy")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--starts", type=int, default=3)
    args = parser.parse_args(argv)
    client = docker.from_env()
    network.ensure_image(client)
    root = Path(tempfile.mkdtemp(prefix="egress-bench-"))
    starts = []
    for i in range(args.starts):
        egress = egress_plan.plan(root / f"start-{i}", ("pypi.org",))
        t = time.monotonic()
        network.ensure(client, egress)
        starts.append(time.monotonic() - t)
        network.shutdown(client, {egress.key}, shared=False)
    say(f"proxy set start (network, holder, proxy): {stats(starts)}")
    with echo_server(client, (TUNNELLED, INTERCEPTED), label="wakeloop.bench") as (_server, ca):
        (root / "ca.pem").write_text(ca)
        os.environ.update(
            {
                VAR: "bench-value-0123456789",
                egress_plan.PRIVATE_OK_ENV: f"{TUNNELLED},{INTERCEPTED}",
                egress_plan.UPSTREAM_CA_ENV: str(root / "ca.pem"),
            }
        )
        workspace = root / "workspace"
        workspace.mkdir(mode=0o777)
        workspace.chmod(0o777)
        box = DockerSandbox(workspace, _policy(), agent="bench", client=client)
        try:
            egress = box._egress()
            say(f"proxy memory after start: {_memory(client, egress.proxy):.1f} MiB")
            urls = [f"https://{TUNNELLED}/x", f"https://{INTERCEPTED}/x"]
            command = f"python3 -c {shlex.quote(TIMER)} {args.n} " + " ".join(urls)
            out = box.run(command, timeout_s=600, max_output_chars=100_000).output
            try:
                times = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                say(f"the box said: {out[-500:]}")
                return 1
            for url in urls:
                say(f"{url}: {stats(times[url])} per request (new connection each)")
            say(f"proxy memory after {2 * args.n} requests: {_memory(client, egress.proxy):.1f} MiB")
        finally:
            box.close()
            network.shutdown(client, {box._egress().key}, shared=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
