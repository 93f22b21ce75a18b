"""The network allowlist: HTTP(S) to named hosts through a proxy, nothing else.

For a policy with `network: allowlist`, each agent gets:

- an internal Docker bridge network (`internal=True`: no NAT, no forwarding out;
  `inhibit_ipv4`: the host has no address on it, so the sandbox cannot reach
  the Docker host either);
- a network-namespace holder on it: a tiny container that deletes its default
  route and disables IPv6, then sleeps as nobody. Every sandbox call joins its
  namespace (`network_mode=container:...`), so the box's routing table has the
  one on-link route of the internal subnet and nothing else: no route to
  169.254.169.254, to the host or to any outside address, and DNS queries for
  outside names have nowhere to go;
- a proxy container (squid, from Debian's packages: proxy-image/) on that
  internal network, under the alias `wakeloop-proxy`, and on the shared egress
  bridge `wakeloop-egress`. Its squid.conf is generated here from exactly the
  policy's allow_hosts. It refuses every name not on the list, before any DNS
  lookup, and IP-literal targets; then, for a listed name, every destination
  address that is not public internet (NON_PUBLIC: loopback, link-local and the
  metadata address, RFC 1918, CGNAT, unique-local, multicast, reserved), and
  the addresses of the Docker networks it sits on (its neighbours and their
  gateway, the Docker host), read from the engine when the config is written.
  A listed name that resolves to such an address (DNS rebinding, a name the
  engine's resolver answers for a container) is refused like any other.
  Its log is capped, and so are its memory, CPU and processes.

All of it is created on demand, reused while it runs, labelled `wakeloop.egress`
so leftovers can be found, and removed by `shutdown`, which the CLI calls when
it exits. Not here: whether a policy may use the network (policy/load.py),
the sandbox's other settings (engine.py), the `bridge` preset (just Docker's
default bridge, set in engine.py's container_spec).
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import docker.types

from orchestrator.assets import asset_dir
from orchestrator.errors import EnvironmentFault

from orchestrator.policy.load import parse_host
from orchestrator.sandbox.programs import HOLDER_SCRIPT

LABEL = "wakeloop.egress"  # on every container and network created here
PROXY_IMAGE = "wakeloop-proxy:latest"
PROXY_ALIAS = "wakeloop-proxy"  # the proxy's name on each internal network
PROXY_PORT = 3128  # squid's usual port
EGRESS_NETWORK = "wakeloop-egress"  # the one bridge with a way out, proxies only
DEFAULT_PORTS = (80, 443)  # a bare `host` entry: plain HTTP and HTTPS
READY_TIMEOUT_S = 30  # squid starts in about a second; a build is not counted
POLL_S = 0.2  # readiness polling interval
PROXY_MEMORY = 256 * 2**20  # bytes; squid without a disk cache stays far below
PROXY_PIDS = 128  # squid and its helpers
PROXY_CPUS = 0.5  # of one core: a proxy for one agent's downloads
PROXY_LOG = {"max-size": "1m", "max-file": "1"}  # squid logs each request to stdout: keep 1 MB
# Destinations that are not the public internet, by the address a name resolves
# to (squid's `dst`); no two overlap, as squid wants within one acl. The proxy's
# own Docker networks are added when its config is written (docker_subnets).
NON_PUBLIC = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # RFC 1918
    "100.64.0.0/10",  # carrier-grade NAT
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local, the cloud metadata address
    "172.16.0.0/12",  # RFC 1918 (Docker's default pools)
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # documentation
    "192.168.0.0/16",  # RFC 1918
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation
    "203.0.113.0/24",  # documentation
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, broadcast
    "::/128",
    "::1/128",  # unspecified, loopback
    "100::/64",  # discard
    "2001:db8::/32",  # documentation
    "fc00::/7",  # unique-local
    "fe80::/10",  # link-local
    "fec0::/10",  # site-local (deprecated)
    "ff00::/8",  # multicast
)


class NetworkError(EnvironmentFault):
    """The allowlist could not be set up: one line for the human."""


@dataclass(frozen=True)
class Egress:
    """The names of one agent's allowlist plumbing; `plan` makes it, `ensure` builds it."""

    key: str
    allow_hosts: tuple[str, ...]

    @property
    def internal_network(self) -> str:
        return f"wakeloop-allow-{self.key}"

    @property
    def holder(self) -> str:
        return f"wakeloop-netns-{self.key}"

    @property
    def proxy(self) -> str:
        return f"wakeloop-proxy-{self.key}"

    @property
    def network_mode(self) -> str:
        return f"container:{self.holder}"

    @property
    def proxy_url(self) -> str:
        return f"http://{PROXY_ALIAS}:{PROXY_PORT}"

    def env(self) -> dict[str, str]:
        """What the sandbox gets; both cases, since tools disagree on which they read."""
        url = self.proxy_url
        return {
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "NO_PROXY": "localhost,127.0.0.1",
            "no_proxy": "localhost,127.0.0.1",
        }


def plan(workspace: Path, allow_hosts: tuple[str, ...]) -> Egress:
    """Pure: the names for this agent and list. One set per agent (keyed by its
    workspace), so one agent's sandbox never shares a network with another's."""
    digest = hashlib.sha256(f"{Path(workspace).resolve()}\n{sorted(allow_hosts)}".encode())
    return Egress(key=digest.hexdigest()[:12], allow_hosts=tuple(allow_hosts))


# -- squid.conf -------------------------------------------------------------------


def squid_config(allow_hosts: tuple[str, ...], docker_subnets: tuple[str, ...] = ()) -> str:
    """squid.conf allowing exactly `allow_hosts` (validated by policy/load.py's parse_host),
    to public addresses only: never NON_PUBLIC, never `docker_subnets` (the
    proxy's own networks, whatever address pool the engine uses)."""
    lines = [
        f"http_port {PROXY_PORT}",
        f"visible_hostname {PROXY_ALIAS}",
        "pid_filename /tmp/squid.pid",
        "cache deny all",
        "cache_mem 8 MB",
        "access_log stdio:/dev/stdout",
        "cache_log stdio:/dev/stderr",
        "cache_store_log none",
        "logfile_rotate 0",
        "coredump_dir /tmp",
        "shutdown_lifetime 1 seconds",
        "forwarded_for delete",
        "via off",
        "httpd_suppress_version_string on",
        f"acl to_nonpublic dst {' '.join(NON_PUBLIC)}",
        f"acl to_docker dst {' '.join(docker_subnets)}" if docker_subnets else "acl to_docker dst 0.0.0.0/32",
        f"acl default_ports port {' '.join(map(str, DEFAULT_PORTS))}",
    ]
    allowed = []
    for i, entry in enumerate(allow_hosts):
        wildcard, host, port = parse_host(entry)
        if wildcard:  # subdomains only: one or more labels before the domain
            lines.append(f"acl host_{i} dstdom_regex -n -i ^([a-z0-9-]+\\.)+{re.escape(host)}$")
        else:
            lines.append(f"acl host_{i} dstdomain -n {host}")
        if port:
            lines.append(f"acl port_{i} port {port}")
        lines.append(f"acl allowed_{i} all-of host_{i} {f'port_{i}' if port else 'default_ports'}")
        allowed.append(f"allowed_{i}")
    lines += [
        f"acl allowed any-of {' '.join(allowed)}" if allowed else "acl allowed src 0.0.0.0/32",
        # Order matters: names are checked first, without DNS, so a name that is
        # not on the list is never even looked up (no DNS channel through squid).
        # Then the address a listed name resolves to (`dst`), for plain HTTP and
        # CONNECT alike: squid connects to the address it checked here.
        "http_access deny !allowed",
        "http_access deny to_nonpublic",
        "http_access deny to_docker",
        "http_access deny to_localhost",
        "http_access allow allowed",
        "http_access deny all",
        "",
    ]
    return "\n".join(lines)


# -- creating and finding ------------------------------------------------------------

ENSURE_ATTEMPTS = 3  # a network removed under us by another process: look again
_started: set[str] = set()  # egress keys this process created, for shutdown


def ensure(client: docker.DockerClient, egress: Egress) -> None:
    """Create whatever of this agent's network, holder and proxy is missing, and
    wait until the proxy accepts connections. Idempotent; cheap when all runs."""
    for attempt in range(ENSURE_ATTEMPTS):
        try:
            _ensure_image(client)
            internal = _ensure_network(client, egress.internal_network, internal=True, key=egress.key)
            outside = _ensure_network(client, EGRESS_NETWORK, internal=False, key="shared")
            _ensure_holder(client, egress, internal)
            _ensure_proxy(client, egress, internal, outside)
            return
        except docker.errors.NotFound as exc:
            # Another process's shutdown removed the shared network between our lookup
            # and our connect: look again (a proxy left unstarted is made anew).
            if attempt + 1 == ENSURE_ATTEMPTS:
                raise NetworkError(f"cannot set up the allowlist proxy: {_first_line(exc)}") from None
        except docker.errors.DockerException as exc:
            raise NetworkError(f"cannot set up the allowlist proxy: {_first_line(exc)}") from None


def alive(client: docker.DockerClient, egress: Egress) -> bool:
    """Whether the agent's netns holder and proxy both still run (two inspects)."""
    try:
        return all(client.api.inspect_container(name)["State"]["Running"] for name in (egress.holder, egress.proxy))
    except docker.errors.DockerException:
        return False


def _labels(key: str) -> dict:
    return {LABEL: "1", f"{LABEL}.key": key}


def _ensure_image(client) -> None:
    try:
        client.images.get(PROXY_IMAGE)
    except docker.errors.ImageNotFound:
        client.images.build(path=str(asset_dir("proxy-image")), tag=PROXY_IMAGE, rm=True, labels={LABEL: "1"})


def _ensure_network(client, name: str, internal: bool, key: str):
    """The network `name`, made if missing. The engine does not keep names
    unique (two processes creating at once both succeed), and a container
    connected to an ambiguous name cannot start; so the oldest copy wins, and
    a process whose copy lost removes it (only its own: it may be in use)."""
    if _named(client, name):
        return find_network(client, name)
    options = {"com.docker.network.bridge.inhibit_ipv4": "true"} if internal else {}
    try:
        mine = client.networks.create(
            name, driver="bridge", internal=internal, options=options, labels=_labels(key), check_duplicate=True
        )
    except docker.errors.APIError as exc:
        if exc.status_code != 409:
            raise
        return find_network(client, name)  # another process made it meanwhile
    winner = find_network(client, name)
    if winner.id != mine.id:
        _quiet(mine.remove)
    return winner


def _named(client, name: str) -> list:
    return [n for n in client.networks.list(names=[name]) if n.name == name]


def find_network(client: docker.DockerClient, name: str):
    """The network called `name`: the oldest, if a race left two (see _ensure_network)."""
    found = _named(client, name)
    if not found:
        raise docker.errors.NotFound(f"network {name} not found")
    winner = min(found, key=lambda n: (n.attrs.get("Created", ""), n.id))
    return client.networks.get(winner.id)


def _running(client, name: str):
    """The container if it runs; a stopped or dead one is removed and None returned."""
    try:
        container = client.containers.get(name)
    except docker.errors.NotFound:
        return None
    if container.status == "running":
        return container
    container.remove(force=True)
    return None


def _ensure_holder(client, egress: Egress, internal) -> None:
    if _running(client, egress.holder):
        return
    _started.add(egress.key)
    container = client.containers.create(
        PROXY_IMAGE,
        ["sh", "-c", HOLDER_SCRIPT],
        name=egress.holder,
        hostname="sandbox",
        user="0:0",
        network=internal.name,
        labels={**_labels(egress.key), f"{LABEL}.role": "netns"},
        cap_drop=["ALL"],
        cap_add=["NET_ADMIN", "SETUID", "SETGID"],
        security_opt=["no-new-privileges"],
        read_only=True,
        # The engine's resolver in this namespace forwards outside names to these
        # servers; 127.0.0.1 has none, so a lookup fails here, at once, and the
        # sandbox (which shares this resolv.conf) is not kept waiting.
        dns=["127.0.0.1"],
        dns_opt=["timeout:1", "attempts:1"],
        sysctls={"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"},
        mem_limit=16 * 2**20,
        pids_limit=8,
        init=True,
        detach=True,
    )
    container.start()
    _wait_for_log(container, "ready", "network holder")


def _ensure_proxy(client, egress: Egress, internal, outside) -> None:
    if _running(client, egress.proxy):
        return
    _started.add(egress.key)
    subnets = docker_subnets(internal, outside)
    container = client.containers.create(
        PROXY_IMAGE,
        name=egress.proxy,
        user="proxy",
        hostname=PROXY_ALIAS,
        environment={"WAKELOOP_SQUID_CONF": squid_config(egress.allow_hosts, subnets)},
        labels={**_labels(egress.key), f"{LABEL}.role": "proxy", f"{LABEL}.allow_hosts": ",".join(egress.allow_hosts)},
        network=internal.name,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        read_only=True,
        tmpfs={"/tmp": "rw,nosuid,nodev,size=16m"},
        mem_limit=PROXY_MEMORY,
        memswap_limit=PROXY_MEMORY,
        pids_limit=PROXY_PIDS,
        nano_cpus=int(PROXY_CPUS * 1e9),
        log_config=docker.types.LogConfig(type="json-file", config=PROXY_LOG),
        init=True,
        detach=True,
    )
    # The alias on the internal network is how the sandbox finds the proxy.
    internal.disconnect(container)
    internal.connect(container, aliases=[PROXY_ALIAS])
    outside.connect(container)
    container.start()
    _wait_for_log(container, "Accepting HTTP Socket connections", "proxy")


def docker_subnets(*networks) -> tuple[str, ...]:
    """The subnets the engine gave `networks` (IPv4 and IPv6), from their inspect."""
    found = []
    for net in networks:
        net.reload()
        for conf in (net.attrs.get("IPAM") or {}).get("Config") or []:
            if conf.get("Subnet") and conf["Subnet"] not in found:
                found.append(conf["Subnet"])
    return tuple(found)


def _wait_for_log(container, text: str, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        container.reload()
        logs = container.logs().decode(errors="replace")
        if text in logs:
            return
        if container.status in ("exited", "dead"):
            break
        time.sleep(POLL_S)
    tail = " | ".join(container.logs(tail=5).decode(errors="replace").split("\n")[-5:])
    container.remove(force=True)
    raise NetworkError(f"the allowlist {what} did not start: {tail.strip() or 'no output'}")


# -- finding and removing ------------------------------------------------------------


def started() -> bool:
    """Whether this process created allowlist plumbing that `shutdown` should remove."""
    return bool(_started)


def leftovers(client: docker.DockerClient) -> tuple[list, list]:
    """(containers, networks) labelled by this module, from any process."""
    containers = client.containers.list(all=True, filters={"label": f"{LABEL}=1"})
    networks = client.networks.list(filters={"label": f"{LABEL}=1"})
    return containers, networks


def shutdown(client: docker.DockerClient, keys: set[str] | None = None, shared: bool = True) -> int:
    """Remove the proxies, holders and internal networks of `keys` (default: those
    this process started); the shared egress network too once no proxy uses it,
    unless `shared` is False (one agent's set retired while others come and go:
    removing the shared network then races whoever is about to use it).
    Returns how many objects were removed."""
    keys = set(_started) if keys is None else set(keys)
    removed = 0
    containers, networks = leftovers(client)
    for container in containers:
        if container.labels.get(f"{LABEL}.key") in keys:
            _quiet(container.remove, force=True)
            removed += 1
    for net in networks:
        if net.attrs.get("Labels", {}).get(f"{LABEL}.key") in keys:
            removed += _quiet(net.remove)
    _started.difference_update(keys)
    if shared and not [c for c in leftovers(client)[0] if c.labels.get(f"{LABEL}.role") == "proxy"]:
        for net in client.networks.list(names=[EGRESS_NETWORK]):
            if net.name == EGRESS_NETWORK:
                removed += _quiet(net.remove)
    return removed


def _quiet(action, **kwargs) -> int:
    """Run a removal; 0 if it was already gone or is still in use elsewhere."""
    try:
        action(**kwargs)
        return 1
    except docker.errors.NotFound:
        return 0
    except docker.errors.APIError:
        return 0  # still has endpoints (another process's sandbox); a later shutdown gets it


def _first_line(exc: Exception) -> str:
    text = str(getattr(exc, "explanation", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
