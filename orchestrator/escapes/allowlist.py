"""Allowlist attacks: use the `network: allowlist` proxy to reach what is not the
public internet — a private address, the proxy's neighbours, a host not on the
list — or get round the proxy altogether.

Each probe runs in a box of its own under the lab's policy switched to
`network: allowlist` with the probe's own list, so it runs whatever policy the
lab has. Where a probe needs something to reach, it stands up its own HTTP
server container on this machine, gives it an allowlisted name (an alias that
the engine's resolver, which the proxy asks, answers with the container's private
address), and removes it afterwards with the probe's proxy and networks.

Nothing here sends a packet off this machine: every name is under .test and
is either an alias of the probe's own server or refused before any lookup;
"no direct route" is read from the routing table and from UDP connect()s,
which look up a route and send nothing. Refused means the proxy answered 403
and the probe's server logged no request; reached means the server logged one.

Not here: the proxy itself (sandbox/egress/network.py) and its config (egress_plan.py), the
`network: none` probes (network_probes.py).
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import time
from contextlib import contextmanager
from dataclasses import replace

from orchestrator.escapes.lab import Probe, Trial, escaped, held, python_command
from orchestrator.sandbox.egress import egress_plan, network

CATEGORY = "allowlist"
SERVER_PORT = 8080  # the probe's own HTTP server
SERVER_READY_S = 20  # python3 -m http.server starts in well under a second
POLL_S = 0.1  # while waiting for the server's "Serving HTTP" line
REQUEST_TIMEOUT_S = 10  # the proxy answers a refusal in milliseconds
LABEL = "wakeloop.escapes.allowlist"  # on every container and network made here
SERVING = "Serving HTTP"

# In the box: one request through the proxy (plain HTTP) and one CONNECT
# tunnel per target; prints one JSON line {target: {"http": ..., "connect": ...}}.
REQUESTS = r"""
import http.client, json, os, urllib.error, urllib.request
def plain(host, port):
    try:
        r = urllib.request.urlopen(f"http://{host}:{port}/wakeloop-probe", timeout=%(timeout)d)
        return {"status": r.status}
    except urllib.error.HTTPError as e:
        return {"status": e.code}
    except Exception as e:
        return {"error": str(getattr(e, "reason", e))}
def tunnel(host, port):
    phost, pport = os.environ["HTTPS_PROXY"].split("//")[-1].rstrip("/").split(":")
    c = http.client.HTTPConnection(phost, int(pport), timeout=%(timeout)d)
    c.set_tunnel(host, port)
    try:
        c.request("GET", "/wakeloop-probe-tunnel")
        return {"status": c.getresponse().status}
    except OSError as e:   # http.client raises "Tunnel connection failed: 403 Forbidden"
        text = str(e)
        return {"status": 403} if "Tunnel connection failed: 403" in text else {"error": text}
routes = [l.split()[0] for l in open("/proc/net/route").readlines()[1:] if l.split()]
out = {f"{h}:{p}": {"http": plain(h, p), "connect": tunnel(h, p)} for h, p in TARGETS}
print("RESULT", json.dumps({"routes": routes, "answers": out}))
""" % {"timeout": REQUEST_TIMEOUT_S}  # noqa: UP031 (the script is full of f-string braces)


@contextmanager
def _allowlist_box(t: Trial, allow_hosts: tuple[str, ...]):
    """A box under the lab's policy with `network: allowlist` and `allow_hosts`,
    and its egress plan; its proxy, holder and network are removed afterwards."""
    policy = replace(t.lab.policy, network="allowlist", allow_hosts=allow_hosts)
    egress = egress_plan.plan_for(t.workspace, policy)
    try:
        yield t.new_box(policy=policy, warm=0), egress
    finally:
        network.shutdown(t.lab.client, {egress.key})


@contextmanager
def _server(t: Trial, net, alias: str):
    """The probe's HTTP server on `net`, known there as `alias`; yields the container."""
    container = t.lab.client.containers.create(
        t.lab.policy.image,
        ["python3", "-u", "-m", "http.server", str(SERVER_PORT), "-d", "/tmp"],
        user="1000:1000",
        read_only=True,
        tmpfs={"/tmp": "rw,nosuid,nodev,size=1m"},
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        mem_limit=64 * 2**20,
        pids_limit=16,
        labels={LABEL: t.lab.run_id},
        network=net.name,
        detach=True,
    )
    try:
        net.disconnect(container)
        net.connect(container, aliases=[alias])
        container.start()
        deadline = time.monotonic() + SERVER_READY_S
        while SERVING not in container.logs().decode(errors="replace"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the probe's server did not start: {container.logs()[-200:]!r}")
            time.sleep(POLL_S)
        container.reload()
        yield container
    finally:
        container.remove(force=True)


def _address(container, net) -> str:
    return container.attrs["NetworkSettings"]["Networks"][net.name]["IPAddress"]


def _requests_seen(server) -> list[str]:
    """The request lines the server logged (http.server writes one per request)."""
    return [
        line for line in server.logs().decode(errors="replace").splitlines() if line.strip() and SERVING not in line
    ]


def _ask(box, targets: list[tuple[str, int]]) -> dict | str:
    """Run REQUESTS in the box: {"routes": the box's IPv4 route interfaces,
    "answers": per target}, or what the box said instead."""
    result = box.run(python_command(f"TARGETS = {targets!r}\n" + REQUESTS), timeout_s=60, max_output_chars=20_000)
    for line in result.output.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    return f"the request program said: {result.output[-300:]!r} (exit {result.exit_code})"


def _judge(answers: dict | str, server, what: str) -> str:
    """ESCAPED if the server saw a request or the proxy passed one (2xx); HELD
    only if every answer is the proxy's 403 and the server saw nothing."""
    seen = _requests_seen(server)
    if seen:
        return escaped(f"the proxy reached {what}; it logged {seen[0].strip()[:120]!r}")
    if isinstance(answers, str):
        return answers
    if not answers["routes"]:  # gVisor run with --network=none ignores the holder's netns
        return held(
            "the box has no route at all on this runtime: neither the proxy nor "
            f"{what} is reachable (the server logged no request)"
        )
    by_target = answers["answers"]
    passed = {
        k: v
        for k, v in by_target.items()
        if 200 <= v["http"].get("status", 0) < 300 or 200 <= v["connect"].get("status", 0) < 300
    }
    if passed:
        return escaped(f"the proxy passed requests to {what}: {passed}")
    refused = all(v["http"].get("status") == 403 and v["connect"].get("status") == 403 for v in by_target.values())
    if refused:
        return held(
            f"the proxy answered 403 to plain HTTP and CONNECT for {sorted(answers)} "
            f"({what}); the server logged no request"
        )
    return f"neither refused nor passed: {answers}"


@contextmanager
def _private_network(t: Trial):
    """A machine-local network of the probe's own (internal: no way off the host)."""
    net = t.lab.client.networks.create(
        f"wakeloop-probe-{secrets.token_hex(4)}", driver="bridge", internal=True, labels={LABEL: t.lab.run_id}
    )
    try:
        yield net
    finally:
        net.remove()  # its server and the proxy are gone by now (inner contexts close first)


def _private_destination(t: Trial) -> str:
    name = "private.wakeloop-probe.test"
    with (
        _private_network(t) as net,
        _server(t, net, name) as server,
        _allowlist_box(t, (f"{name}:{SERVER_PORT}",)) as (box, egress),
    ):
        address = _address(server, net)
        if not ipaddress.ip_address(address).is_private:
            return f"the probe's network got a public address {address}: cannot judge"
        # The proxy joins the probe's network after its config was written, so
        # only the rule on private addresses, not its own subnets, stands between.
        net.connect(t.lab.client.containers.get(egress.proxy))
        return _judge(
            _ask(box, [(name, SERVER_PORT)]),
            server,
            f"allowlisted {name}, which resolves to the private address {address}",
        )


def _neighbours(t: Trial) -> str:
    name = "neighbour.wakeloop-probe.test"
    with _allowlist_box(t, (f"{name}:{SERVER_PORT}",)) as (box, egress):
        outside = network.find_network(t.lab.client, network.EGRESS_NETWORK)
        with _server(t, outside, name) as server:
            address = _address(server, outside)
            verdict = _judge(
                _ask(box, [(name, SERVER_PORT)]),
                server,
                f"allowlisted {name}, a container beside the proxy at {address}",
            )
        if not verdict.startswith(("HELD", "ESCAPED")):
            return verdict
        # The gateway (the Docker host's address on the egress bridge) has no
        # name the proxy could be given; the proxy's running config must cover it.
        outside.reload()
        gateways = [c["Gateway"] for c in outside.attrs["IPAM"]["Config"] or [] if c.get("Gateway")]
        conf = _running_config(t, egress)
        uncovered = [g for g in gateways if not _denied_by(conf, g)]
        if uncovered:
            return verdict + escaped(f"the proxy's config denies no range holding the egress gateway {uncovered}")
        if verdict.startswith("ESCAPED"):
            return verdict
        return held(verdict[len("HELD:") :].strip() + f"; its config denies the egress gateway {gateways}")


def _running_config(t: Trial, egress) -> dict:
    env = t.lab.client.api.inspect_container(egress.proxy)["Config"]["Env"] or []
    text = next((e.split("=", 1)[1] for e in env if e.startswith("WAKELOOP_EGRESS_CONF=")), "{}")
    return json.loads(text)


def _denied_by(conf: dict, address: str) -> bool:
    """Whether the proxy's config refuses `address`: it checks addresses and a range it blocks holds it."""
    ip = ipaddress.ip_address(address)
    return bool(conf.get("check_addresses")) and any(
        ip.version == ipaddress.ip_network(n, strict=False).version and ip in ipaddress.ip_network(n, strict=False)
        for n in conf.get("blocked", [])
    )


def _unlisted_host(t: Trial) -> str:
    listed, unlisted = "listed.wakeloop-probe.test", "unlisted.wakeloop-probe.test"
    with _allowlist_box(t, (f"{listed}:{SERVER_PORT}",)) as (box, _egress):
        outside = network.find_network(t.lab.client, network.EGRESS_NETWORK)
        # A real server under the unlisted name: a proxy that let the name through
        # would reach it, on this machine; the real one refuses before any lookup.
        with _server(t, outside, unlisted) as server:
            address = _address(server, outside)
            return _judge(
                _ask(box, [(unlisted, SERVER_PORT), (address, SERVER_PORT)]),
                server,
                f"{unlisted} and its address {address}, neither on the list",
            )


NO_DIRECT_ROUTE = r"""
import struct
routes = [l.split() for l in open("/proc/net/route").readlines()[1:] if l.split()]
default = [r for r in routes if r[1] == "00000000" or r[2] != "00000000"]
v6 = [l.split()[-1] for l in open("/proc/net/if_inet6")] if os.path.exists("/proc/net/if_inet6") else []
v6 = [n for n in v6 if n != "lo"]
def on_link(host):
    # The box's own network may be given any of the engine's pools (192.168.0.0/20
    # once the 172.x ones are taken): an address inside it reaches that network,
    # which has no gateway, not the outside.
    (address,) = struct.unpack("<I", socket.inet_aton(host))
    return any(address & int(r[7], 16) == int(r[1], 16) for r in routes if r[2] == "00000000")
routed = []
for host in ("169.254.169.254", "1.1.1.1", "10.0.0.1", "192.168.0.1", "172.16.0.1", "8.8.8.8"):
    if on_link(host):
        continue
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((host, 9)); routed.append(host)   # a route lookup: nothing is sent
    except OSError:
        pass
    finally:
        s.close()
if not os.environ.get("HTTPS_PROXY"):
    print("no proxy configured: not an allowlist box")
elif default or v6 or routed:
    escaped(f"a way round the proxy: default/gateway routes {default}, IPv6 on {v6}, routes to {routed}")
elif not routes:
    held("no route at all (this runtime ignores the holder's network namespace): nothing is reachable")
else:
    held(f"one on-link route ({[r[0] for r in routes]}), no gateway, no IPv6; no route to the metadata "
         "address, private or public addresses: only the proxy is reachable")
"""


def _no_direct_route(t: Trial) -> str:
    with _allowlist_box(t, ("route.wakeloop-probe.test",)) as (box, _egress):
        result = box.run(python_command(NO_DIRECT_ROUTE), timeout_s=30, max_output_chars=20_000)
        return result.output + f"\n[host: exit {result.exit_code}]"


allowlist_refuses_private_destination = Probe(
    "allowlist_refuses_private_destination",
    CATEGORY,
    "an allowlisted name resolving to a private address is refused (403); the server there sees nothing",
    _private_destination,
)

allowlist_refuses_proxy_gateway_and_neighbours = Probe(
    "allowlist_refuses_proxy_gateway_and_neighbours",
    CATEGORY,
    "an allowlisted name of a container on the proxy's egress network is refused; its gateway is denied",
    _neighbours,
)

allowlist_refuses_unlisted_host = Probe(
    "allowlist_refuses_unlisted_host",
    CATEGORY,
    "a host or IP address not on the list is refused by the proxy (403), before any lookup",
    _unlisted_host,
)

allowlist_has_no_direct_route = Probe(
    "allowlist_has_no_direct_route",
    CATEGORY,
    "the allowlist box has no default route, no IPv6, no route to any outside address",
    _no_direct_route,
)

PROBES = [
    allowlist_refuses_private_destination,
    allowlist_refuses_proxy_gateway_and_neighbours,
    allowlist_refuses_unlisted_host,
    allowlist_has_no_direct_route,
]
