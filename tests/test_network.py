"""The network allowlist (issue 4), on this machine only, against our own containers.

Two small HTTP servers of the tests' own sit on the proxies' bridge network:
`allowed.wakeloop.test` (on the policy's list, port 8080 only) and
`denied.wakeloop.test` (not on it). One probe program runs inside a sandbox
under `network: allowlist` and once under `network: none`, and reports what
each attempt did; each test below asserts one promise.

These tests are about names, ports and routes. The servers live at private
addresses (the only kind on this machine), which the real proxy refuses by
address; so the operator's setting that lets it reach a named host at a private
address (egress_plan.PRIVATE_OK_ENV) names the allowed server, and only it. The
address rules are proven by the tests at the end, against the proxy itself with
no network, and by the escape suite's `allowlist` probes against the real proxy.

No probe sends a packet off this machine. "Reachable" is only ever tried
against the two servers here. "No route" is proven by the routing table and by
connecting a UDP socket, which is a route lookup that sends nothing; the only
TCP connects go to our own servers' addresses and to the host's own bridges.
DNS is only asked for names under .test and .invalid, which no resolver
anywhere answers, and the probe's resolver has no route out anyway.
"""

from __future__ import annotations

import json
import shlex
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.policy.load import policy_from_mapping
from orchestrator.sandbox.egress import egress_plan, network
from orchestrator.sandbox.engine import DockerSandbox

SERVER_PORT = 8080  # both test servers listen here
UNLISTED_PORT = 8081  # on the allowed host, but not on the list
SERVER_READY_S = 20  # python3 -m http.server starts in well under a second
PROBE_TIMEOUT_S = 120  # the whole probe program, all attempts
ALLOWED, DENIED = "allowed.wakeloop.test", "denied.wakeloop.test"
TEST_LABEL = "wakeloop.nettest"  # on our servers, so only they are ever removed

# Runs in the sandbox as `python3 -I -c PROBE TARGETS_JSON`; prints one JSON object.
PROBE = r"""
import errno, http.client, json, os, socket, sys, urllib.request
t = json.loads(sys.argv[1])
def err(e):
    return errno.errorcode.get(getattr(e, "errno", None) or 0) or f"{type(e).__name__}: {e}"
def via_proxy(url):
    try:
        r = urllib.request.urlopen(url, timeout=10)
        return {"status": r.status, "body": r.read(100).decode()}
    except urllib.error.HTTPError as e:
        return {"status": e.code}
    except Exception as e:
        return {"error": err(getattr(e, "reason", e))}
def tunnel(host, port):
    proxy = os.environ.get("HTTPS_PROXY", "")
    if not proxy:
        return {"error": "no proxy configured"}
    phost, pport = proxy.split("//")[-1].rstrip("/").split(":")
    c = http.client.HTTPConnection(phost, int(pport), timeout=10)
    c.set_tunnel(host, port)
    try:
        c.request("GET", "/hello.txt")
        r = c.getresponse()
        return {"status": r.status, "body": r.read(100).decode()}
    except OSError as e:
        return {"error": str(e)}
def tcp(ip, port):
    s = socket.socket()
    s.settimeout(8)
    try:
        s.connect((ip, port))
        return {"connected": True}
    except OSError as e:
        return {"error": err(e)}
def route(ip):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((ip, 9))   # a route lookup only: UDP connect sends nothing
        return {"route": True}
    except OSError as e:
        return {"error": err(e)}
def dns(name):
    try:
        return {"resolved": socket.getaddrinfo(name, 80)[0][4][0]}
    except OSError as e:
        return {"error": str(e)}
out = {
    "routes": open("/proc/net/route").read().splitlines()[1:],
    "ipv6": [l for l in open("/proc/net/if_inet6").read().splitlines() if not l.endswith(" lo")]
            if os.path.exists("/proc/net/if_inet6") else [],
    "http_allowed": via_proxy(f"http://{t['allowed']}:{t['port']}/hello.txt"),
    "http_allowed_unlisted_port": via_proxy(f"http://{t['allowed']}:{t['unlisted_port']}/"),
    "http_denied": via_proxy(f"http://{t['denied']}:{t['port']}/hello.txt"),
    "http_ip_literal": via_proxy(f"http://{t['allowed_ip']}:{t['port']}/hello.txt"),
    "connect_allowed": tunnel(t["allowed"], t["port"]),
    "connect_denied": tunnel(t["denied"], t["port"]),
    "tcp_allowed_direct": tcp(t["allowed_ip"], t["port"]),
    "tcp_denied_direct": tcp(t["denied_ip"], t["port"]),
    "tcp_docker_host": {ip: tcp(ip, t["host_port"]) for ip in t["host_ips"]},
    "tcp_internal_gateway": tcp(t["internal_gateway"], t["host_port"]) if t["internal_gateway"] else None,
    "dns": {name: dns(name) for name in (t["allowed"], t["denied"], "no-such-host.invalid")},
    "route": {ip: route(ip) for ip in ("169.254.169.254", "192.0.2.1", "10.0.0.1", "1.1.1.1",
                                       *t["host_ips"])},
}
print(json.dumps(out))
"""


def _wait_for_log(container, text: str, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if text in container.logs().decode(errors="replace"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{container.name} did not log {text!r}: {container.logs()[-300:]!r}")


@pytest.fixture(scope="module")
def allowlist_box(docker_client, tmp_path_factory):
    """A sandbox under `network: allowlist` with [allowed.wakeloop.test:8080]; the
    proxy and holder are removed afterwards, as `wakeloop` does on shutdown."""
    from orchestrator.policy.agent import init_agent

    agent_dir = init_agent(tmp_path_factory.mktemp("net") / "agent")
    policy = policy_from_mapping(
        {"sandbox": {"network": "allowlist", "allow_hosts": [f"{ALLOWED}:{SERVER_PORT}"]}}, "test"
    )
    started = time.monotonic()
    with pytest.MonkeyPatch.context() as patch:  # the proxy may reach the allowed server, only it
        patch.setenv(egress_plan.PRIVATE_OK_ENV, ALLOWED)
        box = DockerSandbox(agent_dir / "workspace", policy.sandbox, client=docker_client, warm=0)
        box.setup_s = time.monotonic() - started
        box.egress = box._egress()
        yield box
        box.close()  # its disk released
        network.shutdown(docker_client, {box.egress.key})


@pytest.fixture(scope="module")
def servers(docker_client, allowlist_box):
    """Our two HTTP servers on the proxies' bridge network, by name; removed afterwards."""
    egress = network.find_network(docker_client, network.EGRESS_NETWORK)
    made = {}
    try:
        for alias in (ALLOWED, DENIED):
            c = docker_client.containers.create(
                "wakeloop-sandbox:latest",
                [
                    "bash",
                    "-c",
                    f"mkdir -p /tmp/www && echo hello from {alias} > /tmp/www/hello.txt && "
                    f"exec python3 -u -m http.server {SERVER_PORT} -d /tmp/www",
                ],
                labels={TEST_LABEL: "1"},
                user="1000:1000",
                detach=True,
                network=egress.name,
            )
            made[alias] = c
            egress.disconnect(c)
            egress.connect(c, aliases=[alias])
            c.start()
        for c in made.values():
            _wait_for_log(c, "Serving HTTP", SERVER_READY_S)
            c.reload()
        yield {alias: c.attrs["NetworkSettings"]["Networks"][egress.name]["IPAddress"] for alias, c in made.items()}
    finally:
        for c in made.values():
            c.remove(force=True)


@pytest.fixture(scope="module")
def host_listener(docker_client):
    """A listener of ours on every host address, so a 'refused' would show a way in."""
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen(8)
    sock.settimeout(0.1)
    yield sock.getsockname()[1], sock
    sock.close()


def host_bridge_ips(docker_client) -> list[str]:
    """The Docker host's own addresses on its bridges (docker0, the egress bridge)."""
    ips = []
    for name in ("bridge", network.EGRESS_NETWORK):
        for cfg in network.find_network(docker_client, name).attrs["IPAM"]["Config"] or []:
            if cfg.get("Gateway"):
                ips.append(cfg["Gateway"])
    return ips


def probe(box: DockerSandbox, targets: dict) -> dict:
    assert box.write("probe.py", PROBE.encode()).exit_code == 0
    result = box.run(f"python3 -I probe.py {shlex.quote(json.dumps(targets))}", PROBE_TIMEOUT_S, 100_000)
    assert result.exit_code == 0, result.for_model()
    return json.loads(result.output.strip().splitlines()[-1])


def _targets(servers, docker_client, host_listener, internal_gateway=None) -> dict:
    return {
        "internal_gateway": internal_gateway,
        "allowed": ALLOWED,
        "denied": DENIED,
        "port": SERVER_PORT,
        "unlisted_port": UNLISTED_PORT,
        "allowed_ip": servers[ALLOWED],
        "denied_ip": servers[DENIED],
        "host_ips": host_bridge_ips(docker_client),
        "host_port": host_listener[0],
    }


@pytest.fixture(scope="module")
def allowlist(allowlist_box, servers, docker_client, host_listener):
    started = time.monotonic()
    internal = docker_client.networks.get(allowlist_box.egress.internal_network)
    gateway = internal.attrs["IPAM"]["Config"][0]["Gateway"]
    out = probe(allowlist_box, _targets(servers, docker_client, host_listener, gateway))
    out["probe_s"] = time.monotonic() - started
    return out


@pytest.fixture(scope="module")
def closed(servers, docker_client, host_listener, tmp_path_factory):
    """The same probe under `network: none`."""
    from orchestrator.policy.agent import init_agent

    agent_dir = init_agent(tmp_path_factory.mktemp("none") / "agent")
    with DockerSandbox(
        agent_dir / "workspace", policy_from_mapping({}, "test").sandbox, client=docker_client, warm=0
    ) as box:
        return probe(box, _targets(servers, docker_client, host_listener))


def no_connection_reached(host_listener) -> bool:
    _, sock = host_listener
    try:
        sock.accept()
        return False
    except (TimeoutError, BlockingIOError):
        return True


# -- network: allowlist ----------------------------------------------------------------


def test_allowed_host_is_reachable_through_the_proxy(allowlist):
    assert allowlist["http_allowed"] == {"status": 200, "body": f"hello from {ALLOWED}\n"}


def test_allowed_host_is_reachable_through_a_connect_tunnel(allowlist):
    assert allowlist["connect_allowed"]["status"] == 200
    assert allowlist["connect_allowed"]["body"] == f"hello from {ALLOWED}\n"


def test_host_not_on_the_list_is_refused_by_the_proxy(allowlist):
    assert allowlist["http_denied"] == {"status": 403}
    assert "403" in allowlist["connect_denied"]["error"]


def test_allowed_host_on_a_port_not_on_the_list_is_refused(allowlist):
    assert allowlist["http_allowed_unlisted_port"] == {"status": 403}


def test_an_ip_address_is_refused_even_for_an_allowed_server(allowlist):
    assert allowlist["http_ip_literal"] == {"status": 403}


def test_direct_tcp_bypassing_the_proxy_fails_locally(allowlist):
    assert allowlist["tcp_allowed_direct"] == {"error": "ENETUNREACH"}
    assert allowlist["tcp_denied_direct"] == {"error": "ENETUNREACH"}


def test_dns_resolution_fails(allowlist):
    for name, answer in allowlist["dns"].items():
        assert "resolved" not in answer, (name, answer)


def test_routing_table_has_only_the_internal_subnet_and_no_default_route(allowlist):
    routes = [line.split() for line in allowlist["routes"]]
    assert len(routes) == 1, routes
    iface, destination, _gateway, _flags, *_rest, mask = routes[0][:8]
    assert destination != "00000000" and mask != "00000000"  # not a default route
    assert allowlist["ipv6"] == []


def test_no_route_to_the_metadata_address_or_any_outside_address(allowlist):
    for ip, answer in allowlist["route"].items():
        assert answer == {"error": "ENETUNREACH"}, (ip, answer)


def test_the_docker_host_is_unreachable(allowlist, host_listener):
    for ip, answer in allowlist["tcp_docker_host"].items():
        assert answer == {"error": "ENETUNREACH"}, (ip, answer)
    # The internal network's gateway address is on-link, but the host holds no
    # address there (inhibit_ipv4): nobody answers, so the connect fails.
    assert "connected" not in allowlist["tcp_internal_gateway"]
    assert no_connection_reached(host_listener)


def test_the_proxy_is_reused_and_removed_on_shutdown(docker_client, allowlist_box, allowlist):
    egress = allowlist_box.egress
    proxy_id = docker_client.containers.get(egress.proxy).id
    with DockerSandbox(allowlist_box.workspace, allowlist_box.policy, client=docker_client, warm=0) as again:
        assert docker_client.containers.get(egress.proxy).id == proxy_id
        assert again.run("echo $HTTPS_PROXY", 30, 1000).output.strip() == egress.proxy_url
    containers, networks = network.leftovers(docker_client)
    assert {c.name for c in containers} >= {egress.proxy, egress.holder}
    assert egress.internal_network in {n.name for n in networks}


def test_shutdown_removes_the_proxy_holder_and_network(docker_client, tmp_path):
    from orchestrator.policy.agent import init_agent

    agent_dir = init_agent(tmp_path / "agent")
    policy = policy_from_mapping({"sandbox": {"network": "allowlist", "allow_hosts": ["x.wakeloop.test"]}}, "test")
    box = DockerSandbox(agent_dir / "workspace", policy.sandbox, client=docker_client, warm=0)
    box.close()
    egress = box._egress()  # the module's operator setting (allowlist_box) is part of its key
    assert network.shutdown(docker_client, {egress.key}) >= 3
    containers, networks = network.leftovers(docker_client)
    assert egress.key not in {c.labels.get(f"{network.LABEL}.key") for c in containers}
    assert egress.internal_network not in {n.name for n in networks}


def test_a_command_that_started_a_proxy_removes_it_when_it_ends(docker_client, tmp_path):
    # `wakeloop sandbox exec` on an allowlist agent: its end lets go of what it started
    # (sandbox/keeper.py let_go_here), in a process of its own, so nothing else it holds goes too.
    import subprocess
    import sys

    from orchestrator.policy.agent import init_agent, load_agent
    from tests.helpers import set_policy

    agent_dir = init_agent(tmp_path / "agent")
    set_policy(
        agent_dir, {"sandbox": {"network": "allowlist", "disk": "none", "pool": 0, "allow_hosts": ["x.wakeloop.test"]}}
    )
    agent = load_agent(agent_dir)
    key = egress_plan.plan_for(agent.workspace.resolve(), agent.policy.sandbox).key
    ran = subprocess.run(
        [sys.executable, "-m", "orchestrator", "sandbox", "exec", str(agent_dir), "--", "echo $HTTPS_PROXY"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0 and "http" in ran.stdout, (ran.stdout, ran.stderr)
    assert "could not" not in ran.stderr  # nothing it could not let go of
    containers, networks = network.leftovers(docker_client)
    assert key not in {c.labels.get(f"{network.LABEL}.key") for c in containers}
    assert egress_plan.plan_for(agent.workspace.resolve(), agent.policy.sandbox).internal_network not in {
        n.name for n in networks
    }


def test_setup_and_probe_times_are_reasonable(allowlist_box, allowlist):
    print(f"allowlist setup {allowlist_box.setup_s:.1f}s, probe {allowlist['probe_s']:.1f}s")
    assert allowlist_box.setup_s < 60 and allowlist["probe_s"] < PROBE_TIMEOUT_S


# -- network: none: every one of those fails ---------------------------------------------


def test_none_has_no_route_at_all(closed):
    assert closed["routes"] == [] and closed["ipv6"] == []
    for ip, answer in closed["route"].items():
        assert answer == {"error": "ENETUNREACH"}, (ip, answer)


def test_none_reaches_neither_server_by_any_way(closed):
    for key in ("http_allowed", "http_denied", "http_ip_literal", "http_allowed_unlisted_port"):
        assert "error" in closed[key], (key, closed[key])
    assert closed["connect_allowed"] == {"error": "no proxy configured"}
    assert closed["tcp_allowed_direct"] == {"error": "ENETUNREACH"}
    assert closed["tcp_denied_direct"] == {"error": "ENETUNREACH"}


def test_none_resolves_no_name_and_reaches_no_host_address(closed, host_listener):
    for name, answer in closed["dns"].items():
        assert "resolved" not in answer, (name, answer)
    for ip, answer in closed["tcp_docker_host"].items():
        assert answer == {"error": "ENETUNREACH"}, (ip, answer)
    assert no_connection_reached(host_listener)


# -- the spec ---------------------------------------------------------------------------------


def test_bridge_is_the_engines_default_bridge_and_allowlist_joins_the_holder(agent, docker_client, allowlist_box):
    with DockerSandbox(
        agent.workspace, replace(agent.policy.sandbox, network="bridge"), client=docker_client, warm=0
    ) as bridge:
        assert bridge.container_spec(["true"])[1]["network_mode"] == "bridge"
    config, host = allowlist_box.container_spec(["true"])
    egress = allowlist_box.egress
    assert host["network_mode"] == f"container:{egress.holder}"
    assert config["environment"]["HTTPS_PROXY"] == config["environment"]["http_proxy"] == egress.proxy_url
    assert "hostname" not in config  # the engine refuses one with container: networking
    assert host["cap_drop"] == ["ALL"] and host["read_only"] is True


def test_proxy_config_allows_exactly_the_list():
    egress = egress_plan.plan(Path("/w"), ("pypi.org", "files.example.org:8443", "*.example.net"))
    conf = json.loads(egress_plan.proxy_config(egress))
    assert conf["allow"] == [[False, "pypi.org", None], [False, "files.example.org", 8443], [True, "example.net", None]]
    assert conf["check_addresses"] is True and conf["private_ok"] == [] and conf["intercept"] == {}


# -- the rules on resolved addresses ----------------------------------------------------------

# Names the matrix below gives the proxy in its /etc/hosts. It runs with no
# network (only lo), so an allowed address ends in a connect that fails locally
# (no route: nothing is sent: 502); a refused one never gets that far (403).
REFUSED = {
    "loopback": "127.0.0.1",
    "loopback-other": "127.9.9.9",
    "this-net": "0.1.2.3",
    "rfc1918-10": "10.1.2.3",
    "rfc1918-172": "172.16.5.4",
    "rfc1918-192": "192.168.1.1",
    "cgnat": "100.64.0.1",
    "metadata": "169.254.169.254",
    "link-local": "169.254.1.1",
    "multicast": "224.0.0.251",
    "reserved": "240.0.0.1",
    "broadcast": "255.255.255.255",
    "benchmark": "198.18.0.1",
    "docker-subnet": "203.0.114.9",
    "v6-loopback": "::1",
    "v6-link-local": "fe80::1",
    "v6-ula": "fd00::1",
    "v6-multicast": "ff02::1",
    "v6-doc": "2001:db8::1",
}
PASSED = {"public": "1.1.1.1", "public-2": "8.8.8.8", "v6-public": "2606:4700:4700::1111"}
MATRIX_SUBNETS = ("203.0.114.0/24",)  # stands for a Docker network the engine put in public space

MATRIX_CLIENT = r"""
import json, socket, sys
out = {}
for name in json.loads(sys.argv[1]):
    for line, target in ((f"GET http://{name}.wakeloop.test/ HTTP/1.1\r\nHost: {name}.wakeloop.test\r\n", "http"),
                         (f"CONNECT {name}.wakeloop.test:443 HTTP/1.1\r\nHost: {name}.wakeloop.test:443\r\n",
                          "connect")):
        s = socket.create_connection(("127.0.0.1", 3128), timeout=MATRIX_TIMEOUT_S)
        s.sendall((line + "Connection: close\r\n\r\n").encode())
        head = b""
        try:
            while b"\r\n\r\n" not in head or b"wakeloop" not in head and b"unreachable" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
        except TimeoutError:
            head += b" timed out"
        s.close()
        out[f"{name} {target}"] = head.decode(errors="replace")
print(json.dumps(out))
""".replace("MATRIX_TIMEOUT_S", "10")  # the proxy answers either way in milliseconds


@pytest.fixture(scope="module")
def address_matrix(docker_client):
    """{"<name> http|connect": the proxy's answer} for every name in REFUSED and
    PASSED, from the product's config (`*.wakeloop.test` allowed) in a proxy
    with no network, asked by a client in its namespace."""
    from orchestrator.sandbox.egress.network import PROXY_IMAGE, ensure_image

    ensure_image(docker_client)
    conf = egress_plan.proxy_config(egress_plan.plan(Path("/matrix"), ("*.wakeloop.test",)), MATRIX_SUBNETS)
    hosts = "".join(f"{ip} {name}.wakeloop.test\n" for name, ip in {**REFUSED, **PASSED}.items())
    proxy = docker_client.containers.run(
        PROXY_IMAGE,
        # root, for /etc/hosts (the engine's file, which getaddrinfo reads); a test's proxy only
        ["sh", "-c", 'printf "%s" "$HOSTS" >> /etc/hosts && exec /usr/local/bin/wakeloop-proxy'],
        environment={"WAKELOOP_EGRESS_CONF": conf, "HOSTS": hosts, "HOME": "/tmp"},
        user="0:0",
        network_mode="none",
        # IPv6 on lo, so that the v6 addresses resolve (getaddrinfo's AI_ADDRCONFIG).
        sysctls={"net.ipv6.conf.all.disable_ipv6": "0", "net.ipv6.conf.lo.disable_ipv6": "0"},
        labels={TEST_LABEL: "1"},
        detach=True,
    )
    try:
        _wait_for_log(proxy, network.READY_MARK, SERVER_READY_S)
        out = docker_client.containers.run(
            "wakeloop-sandbox:latest",
            ["python3", "-I", "-c", MATRIX_CLIENT, json.dumps([*REFUSED, *PASSED])],
            network_mode=f"container:{proxy.id}",
            user="1000:1000",
            labels={TEST_LABEL: "1"},
            remove=True,
        )
        return json.loads(out.decode().strip().splitlines()[-1])
    finally:
        proxy.remove(force=True)


def test_the_proxy_refuses_every_non_public_address_a_listed_name_resolves_to(address_matrix):
    for name in REFUSED:
        for how in ("http", "connect"):
            answer = address_matrix[f"{name} {how}"]
            assert answer.startswith("HTTP/1.1 403") and "which is not a public address" in answer, (name, how, answer)


def test_the_proxy_passes_a_public_address_on_to_a_connect(address_matrix):
    # Passed on: the proxy tried to connect, which failed locally (no network).
    for name in PASSED:
        for how in ("http", "connect"):
            answer = address_matrix[f"{name} {how}"]
            assert answer.startswith("HTTP/1.1 502") and "Network is unreachable" in answer, (name, how, answer)


def test_proxy_config_refuses_the_non_public_ranges_and_the_docker_subnets():
    egress = egress_plan.plan(Path("/w"), ("pypi.org",))
    conf = json.loads(egress_plan.proxy_config(egress, ("172.18.0.0/16", "fd00:1::/64")))
    assert conf["blocked"] == [*egress_plan.NON_PUBLIC, "172.18.0.0/16", "fd00:1::/64"]


def test_non_public_ranges_do_not_overlap_and_hold_no_global_address():
    import ipaddress

    nets = [ipaddress.ip_network(n) for n in egress_plan.NON_PUBLIC]
    for i, a in enumerate(nets):  # one table, each address in one range
        assert not any(a.version == b.version and a.overlaps(b) for b in nets[i + 1 :]), a
    for net in nets:
        assert not net.network_address.is_global or net.is_multicast or net.is_site_local, net


def test_the_proxy_container_is_capped(docker_client, allowlist_box):
    egress = allowlist_box.egress
    host = docker_client.api.inspect_container(egress.proxy)["HostConfig"]
    assert host["Memory"] == host["MemorySwap"] == network.PROXY_MEMORY
    assert host["NanoCpus"] == int(network.PROXY_CPUS * 1e9) and host["PidsLimit"] == network.PROXY_PIDS
    assert host["LogConfig"] == {"Type": "json-file", "Config": network.PROXY_LOG}


def test_the_proxy_denies_the_subnets_of_its_own_networks(docker_client, allowlist_box):
    egress = allowlist_box.egress
    env = docker_client.api.inspect_container(egress.proxy)["Config"]["Env"]
    conf = json.loads(next(e.split("=", 1)[1] for e in env if e.startswith("WAKELOOP_EGRESS_CONF=")))
    for name in (network.EGRESS_NETWORK, egress.internal_network):
        for cfg in network.find_network(docker_client, name).attrs["IPAM"]["Config"]:
            assert cfg["Subnet"] in conf["blocked"], (name, conf["blocked"])


def test_a_network_name_two_processes_raced_for_resolves_to_the_oldest_and_the_loser_removes_its_own():
    """The engine lets two creates of one name both succeed; a container on an
    ambiguous name cannot start. No engine here: a stand-in with the race built in."""

    class Net:
        def __init__(self, id, created):
            self.id, self.name, self.attrs, self.removed = id, network.EGRESS_NETWORK, {"Created": created}, False

        def remove(self):
            self.removed = True
            nets.remove(self)

    theirs = Net("b" * 12, "2026-01-01T00:00:00.1Z")
    nets = []

    class Networks:
        def list(self, names):
            return list(nets)

        def get(self, id):
            return next(n for n in nets if n.id == id)

        def create(self, name, **kwargs):
            mine = Net("a" * 12, "2026-01-01T00:00:00.2Z")
            nets.extend([theirs, mine])  # theirs landed between our look and our create
            return mine

    client = type("Client", (), {"networks": Networks()})()
    got = network.ensure_network(client, network.EGRESS_NETWORK, internal=False, key="shared")
    assert got is theirs and nets == [theirs]
