"""The network allowlist: HTTP(S) to named hosts through a proxy, nothing else;
credentials the box uses but never holds; every decision on the record.

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
- a proxy container (mitmproxy from Debian's packages and one addon of ours:
  proxy-image/) on that internal network, under the alias `wakeloop-proxy`, and
  on the shared egress bridge `wakeloop-egress`. Its config (proxy_config) is
  generated from the policy by egress_plan.py. It refuses every name not on the list, before
  any DNS lookup, and IP-literal targets; then, for a listed name, every
  destination address that is not public internet (NON_PUBLIC and whatever
  Python's `ipaddress` does not call global: loopback, link-local and the
  metadata address, RFC 1918, CGNAT, unique-local, multicast, reserved), and the
  addresses of the Docker networks it sits on (its neighbours and their gateway,
  the Docker host), read from the engine when the config is written. The check
  is made where the proxy opens its socket, on the address it then connects to,
  so a listed name that resolves to such an address (DNS rebinding, a name the
  engine's resolver answers for a container) is refused like any other.
  Its log is capped, and so are its memory, CPU and processes.

## Credentials, interception, rules, the record

A host named by `sandbox.credentials` or `sandbox.http` is intercepted: the proxy
ends the box's TLS with a certificate signed by a CA it made at its start, in its
own tmpfs (one per agent: one proxy per agent), whose key never leaves that
container; it prints the CA's certificate, which `ensure` reads from its log and
the box gets in its environment (ca_env): the guard (in_box/guard.py) writes
/tmp/wakeloop-ca.pem, Debian's store plus that certificate, before the command
starts, and SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, GIT_SSL_CAINFO and
NODE_EXTRA_CA_CERTS name it. Upstream certificates are checked against Debian's
store. On an intercepted host the proxy checks each request's method and path
against the host's rules, then sets the credential's header, expanding its
`${VAR}` from WAKELOOP_SECRET_<VAR> in its own environment: the value comes from
the environment of the process that calls `ensure` (the broker under compose),
never from the box, which sees at most a placeholder (`placeholder_env`). A
placeholder in a request to any other host (headers or URL) is refused and
recorded as misdirected. A credential is added only when every name for the
destination is its host: the CONNECT target, the box's TLS name (SNI), the name
upstream is reached and its certificate verified by (always the CONNECT host, never
the box's SNI), an absolute-form target's authority and Host; any other is refused
with the reason in the 403's body. A tunnel to an intercepted host carries TLS
only. On a host with rules, a path that RFC 3986 normalising would change (dot
segments, percent-encoded unreserved characters) or that holds an encoded slash
or a backslash is refused, so a rule sees the path the server will read. Every
other allowed host is tunnelled untouched (its bytes counted). Each connection
and each intercepted request is one JSON line on the proxy's stdout; `decisions`
reads those since a wake began; a request is one line, with its final decision.
The wake's byte budget (`sandbox.max_egress_bytes_per_wake`) is counted by the
proxy from the last `new_wake` (a SIGUSR1); past it, connections and requests are
refused, and a transfer in flight stops there: a tunnel's bytes are cut at the
budget to the byte and its connection closed (the box reads a broken transfer, the
record a deny line); an HTTP request, which the proxy holds whole (up to 32 MB,
body_size_limit), is not passed on when it would pass the budget; an answer whose
Content-Length would is refused at its head (upstream's connection closed at the
first piece of its body), one without a length (or to a box speaking HTTP/2) is
held whole and refused then; the box gets a 403 saying so. Nothing past the budget
reaches the box or upstream; such an answer may be read whole (at most 32 MB) by
the proxy first.

## Why mitmproxy, not squid's ssl-bump

Both are Debian packages. squid-openssl can bump TLS and add a header per acl,
but cannot replace a placeholder inside a header, name the rule that decided in
a body the model reads, count a wake's bytes against a budget, or emit our
decision record without a log-format dialect; each would be a helper process of
ours beside it. mitmproxy's addon API does all of it in one Python file (the same
language as the rest of wakeloop, tested the same way), and one engine serves
tunnels and interception alike, so there is one place that decides. The cost:
a Python event loop per agent (about 60 MB and 1.5 s to start, against squid's
20 MB and 1 s), and throughput bound to one core, plenty for one agent's box.
Debian's 8.1.1 is kept, not a newer mitmproxy from PyPI: every check above is
its addon hooks (the upstream TLS name is set in tls_clienthello, which runs
before upstream TLS starts), but for one reach past them: 8.1.1 ignores
flow.kill() on a tunnel, so a tunnel past the budget is ended by cancelling the
box side's reader through the proxyserver addon's connections, as mitmproxy's
idle timeout does. The probes caps_egress_download_in_flight and
caps_egress_upload_in_flight fail if a change of mitmproxy breaks it.

All of it is created on demand, reused while it runs, labelled `wakeloop.egress`
so leftovers can be found, and removed by `shutdown`, which the CLI calls when
it exits. The proxy image is tagged by a hash of proxy-image/ (images.py's
inputs_hash), so a changed proxy-image/ is built anew. Not here: the plan, what a
policy allows as data (egress_plan.py: Egress, plan, grants, proxy_config, secret_env,
NON_PUBLIC), whether a policy may use the network (policy/load.py), the sandbox's other settings
(engine.py), the `bridge` preset (just Docker's default bridge, set in
engine.py's container_spec), the egress log itself (the records package's egress module).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
from docker.models.containers import Container
from docker.models.networks import Network

from orchestrator.assets import asset_dir
from orchestrator.sandbox.containers.images import inputs_hash
from orchestrator.sandbox.containers.programs import CA_ENV, HOLDER_SCRIPT
from orchestrator.sandbox.egress import egress_plan
from orchestrator.sandbox.egress.egress_plan import PROXY_ALIAS, Egress, NetworkError, secret_env

LABEL = "wakeloop.egress"  # on every container and network created here
PROXY_REPO = "wakeloop-proxy"
EGRESS_NETWORK = "wakeloop-egress"  # the one bridge with a way out, proxies only
DEFAULT_PORTS = (80, 443)  # a bare `host` entry: plain HTTP and HTTPS
READY_TIMEOUT_S = 30  # mitmdump starts in about 1.5 s; a build is not counted
POLL_S = 0.2  # readiness polling interval
PROXY_MEMORY = 256 * 2**20  # bytes; mitmdump idles at about 60 MB, a request's bodies held while it passes
PROXY_PIDS = 128  # mitmdump and its threads
HOLDER_PIDS = 32  # the network holder: runc's start counts too (engine_mounts.KEEPER_PIDS)
PROXY_CPUS = 0.5  # of one core: a proxy for one agent's downloads
# One JSON line per decision on stdout, which `decisions` reads back: room for ~40,000 lines.
PROXY_LOG = {"max-size": "8m", "max-file": "2"}
LINE_MARK = "wakeloop-egress "  # a decision's line on the proxy's stdout starts with this
NEW_WAKE_LINE = "wakeloop-egress: new wake"  # what the proxy prints at SIGUSR1 (egress_addon.py)
MARK_LINE = "wakeloop-egress: mark"  # ... and at SIGUSR2, with its time.time(): the decisions before it are in
SETTLE_S = 5.0  # the most a wake's end waits for the proxy's log to hold every decision
SETTLE_POLL_S = 0.02  # its line comes within milliseconds
MARK_POLL_S = 0.005  # after each call of an agent that asks about hosts: on the call's path
CA_MARK = "wakeloop-egress: ca "  # the CA certificate's line (its newlines as |)
READY_MARK = "wakeloop-egress: ready"


def _proxy_image() -> str:
    """wakeloop-proxy:inputs-<hash of proxy-image/>: a changed proxy-image/ is a new tag, built when missing."""
    directory = asset_dir("proxy-image")
    if directory is None or not (Path(directory) / "Dockerfile").is_file():
        return f"{PROXY_REPO}:latest"
    return f"{PROXY_REPO}:inputs-{inputs_hash(Path(directory))}"


PROXY_IMAGE = _proxy_image()


# -- creating and finding ------------------------------------------------------------

ENSURE_ATTEMPTS = 3  # a network removed under us by another process: look again
_started: set[str] = set()  # egress keys this process created, for shutdown


_cas: dict[str, str] = {}  # proxy container id -> its CA's certificate (PEM), read once


def ensure(client: docker.DockerClient, egress: Egress, environ: Mapping[str, str] = os.environ) -> str:
    """Create whatever of this agent's network, holder and proxy is missing, and
    wait until the proxy accepts connections. Idempotent; cheap when all runs.
    Returns the proxy's CA certificate (PEM) when it intercepts a host, else ""."""
    secrets = secret_env(egress, environ)
    for attempt in range(ENSURE_ATTEMPTS):
        try:
            ensure_image(client)
            internal = ensure_network(client, egress.internal_network, internal=True, key=egress.key)
            outside = ensure_network(client, EGRESS_NETWORK, internal=False, key="shared")
            _ensure_holder(client, egress, internal)
            proxy = _ensure_proxy(client, egress, internal, outside, secrets)
            return _ca_of(proxy) if egress.intercepted else ""
        except docker.errors.NotFound as exc:
            # Another process's shutdown removed the shared network between our lookup
            # and our connect: look again (a proxy left unstarted is made anew).
            if attempt + 1 == ENSURE_ATTEMPTS:
                raise NetworkError(f"cannot set up the allowlist proxy: {_first_line(exc)}") from None
        except docker.errors.DockerException as exc:
            raise NetworkError(f"cannot set up the allowlist proxy: {_first_line(exc)}") from None
    raise AssertionError("unreachable: the last attempt returns or raises")


def alive(client: docker.DockerClient, egress: Egress) -> bool:
    """Whether the agent's netns holder and proxy both still run (two inspects)."""
    try:
        return all(client.api.inspect_container(name)["State"]["Running"] for name in (egress.holder, egress.proxy))
    except docker.errors.DockerException:
        return False


def _labels(key: str) -> dict[str, str]:
    return {LABEL: "1", f"{LABEL}.key": key}


def ensure_image(client: docker.DockerClient) -> None:
    """The proxy image, built from proxy-image/ when missing (the escape suite's echo servers run it too)."""
    try:
        client.images.get(PROXY_IMAGE)
    except docker.errors.ImageNotFound:  # never built, or proxy-image/ changed since
        client.images.build(path=str(asset_dir("proxy-image")), tag=PROXY_IMAGE, rm=True, labels={LABEL: "1"})


def ensure_network(client: docker.DockerClient, name: str, internal: bool, key: str) -> Network:
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


def _named(client: docker.DockerClient, name: str) -> list[Network]:
    return [n for n in client.networks.list(names=[name]) if n.name == name]


def find_network(client: docker.DockerClient, name: str) -> Network:
    """The network called `name`: the oldest, if a race left two (see ensure_network)."""
    found = _named(client, name)
    if not found:
        raise docker.errors.NotFound(f"network {name} not found")
    winner = min(found, key=lambda n: (n.attrs.get("Created", ""), n.id))
    return client.networks.get(winner.id)


def _running(client: docker.DockerClient, name: str) -> Container | None:
    """The container if it runs; a stopped or dead one is removed and None returned."""
    try:
        container = client.containers.get(name)
    except docker.errors.NotFound:
        return None
    if container.status == "running":
        return container
    container.remove(force=True)
    return None


def _ensure_holder(client: docker.DockerClient, egress: Egress, internal: Network) -> None:
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
        pids_limit=HOLDER_PIDS,
        init=True,
        detach=True,
    )
    container.start()
    _wait_for_log(container, "ready", "network holder")


def _ensure_proxy(
    client: docker.DockerClient, egress: Egress, internal: Network, outside: Network, secrets: dict[str, str]
) -> Container:
    running = _running(client, egress.proxy)
    if running:
        return running
    _started.add(egress.key)
    subnets = docker_subnets(internal, outside)
    upstream = {"WAKELOOP_UPSTREAM_CA": egress.upstream_ca} if egress.upstream_ca else {}
    # egress_plan.proxy_config, read off its module at each call: the weakened controls replace it there.
    container = client.containers.create(
        PROXY_IMAGE,
        name=egress.proxy,
        user="proxy",
        hostname=PROXY_ALIAS,
        environment={"WAKELOOP_EGRESS_CONF": egress_plan.proxy_config(egress, subnets), **secrets, **upstream},
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
    _wait_for_log(container, READY_MARK, "proxy")
    return container


def _ca_of(proxy: Container) -> str:
    """The proxy's CA certificate: from the line it printed at its start (the log is capped,
    so it may be gone from a long-running proxy's: then from its file, read as the proxy user)."""
    if proxy.id in _cas:
        return _cas[proxy.id]
    for line in proxy.logs(stderr=False).decode(errors="replace").splitlines():
        if line.startswith(CA_MARK):
            _cas[proxy.id] = line[len(CA_MARK) :].replace("|", "\n").strip() + "\n"
            return _cas[proxy.id]
    code, out = proxy.exec_run(["cat", "/tmp/mitm/mitmproxy-ca-cert.pem"], user="proxy")
    if code != 0:
        raise NetworkError(f"the allowlist proxy {proxy.name} has no CA certificate")
    _cas[proxy.id] = out.decode()
    return _cas[proxy.id]


def ca_env(pem: str) -> dict[str, str]:
    """The container's (not the command's) variable carrying the agent's CA to the guard."""
    return {CA_ENV: pem} if pem else {}


# -- the wake's record and budget --------------------------------------------------------


def new_wake(client: docker.DockerClient, egress: Egress) -> float:
    """A wake begins: the proxy's byte budget starts again (SIGUSR1). Returns the time,
    from which `decisions` reads."""
    began = time.time()
    try:
        client.api.kill(egress.proxy, signal="SIGUSR1")
    except docker.errors.DockerException:
        pass  # no proxy: ensure makes one, with a fresh count
    return began


def settle(client: docker.DockerClient, egress: Egress, since: float, wait_s: float = SETTLE_S) -> None:
    """At a wake's end: wait until every decision the proxy made so far is in its log. It is sent
    SIGUSR1, whose line it prints after every line before it (one stdout, in order); seen, the
    log holds them all. Bounded: a proxy that is gone or stuck costs at most wait_s."""
    seen = _logs(client, egress, since).count(NEW_WAKE_LINE)
    try:
        client.api.kill(egress.proxy, signal="SIGUSR1")
    except docker.errors.DockerException:
        return
    deadline = time.monotonic() + wait_s
    while _logs(client, egress, since).count(NEW_WAKE_LINE) <= seen and time.monotonic() < deadline:
        time.sleep(SETTLE_POLL_S)  # the engine's log has no way to wait for a line: polled


def asked(client: docker.DockerClient, egress: Egress, since: float) -> tuple[str, ...]:
    """The hosts the proxy asked a person about since `since` (one call's start; the call is over):
    `host`, or `host:port` off 80 and 443, as an allow_hosts entry grants them. The proxy is sent
    SIGUSR2 (its budget runs on) and prints a mark with its time, after every line before it: a
    mark printed once the call had ended follows all of the call's decisions, whoever asked for
    it. One signal and mostly one read of the log. () when the plan asks nothing, or no proxy runs."""
    if not egress.ask:
        return ()
    text = _settled(client, egress, since)
    if text is None:
        return ()
    out = []
    for d in _decisions_in(text, since, ""):
        if d.get("decision") == "ask":
            port = d.get("port")
            out.append(str(d["host"]) + ("" if port in DEFAULT_PORTS else f":{port}"))
    return tuple(dict.fromkeys(out))


def settled_decisions(client: docker.DockerClient, egress: Egress, since: float, run_id: str) -> list[dict[str, Any]]:
    """`decisions`, once every decision made before this call is in the proxy's log (its mark)."""
    return _decisions_in(_settled(client, egress, since) or "", since, run_id)


def _settled(client: docker.DockerClient, egress: Egress, since: float) -> str | None:
    """The proxy's log since `since` once it holds a mark printed after now (SIGUSR2), or as it
    stands after SETTLE_S; None when no proxy runs."""
    ended = time.time()
    try:
        client.api.kill(egress.proxy, signal="SIGUSR2")
    except docker.errors.DockerException:
        return None
    deadline = time.monotonic() + SETTLE_S
    text = _logs(client, egress, since)
    while not _marked_after(text, ended) and time.monotonic() < deadline:
        time.sleep(MARK_POLL_S)  # the engine's log has no way to wait for a line: polled
        text = _logs(client, egress, since)
    return text


def _marked_after(text: str, ended: float) -> bool:
    """Whether the proxy's log has a mark it printed at or after `ended` (same host, same clock)."""
    for line in text.splitlines():
        if line.startswith(MARK_LINE + " "):
            try:
                if float(line[len(MARK_LINE) + 1 :]) >= ended:
                    return True
            except ValueError:
                continue
    return False


def _logs(client: docker.DockerClient, egress: Egress, since: float) -> str:
    try:
        raw: bytes = client.api.logs(egress.proxy, stdout=True, stderr=False, since=max(0, int(since) - 1))
    except docker.errors.DockerException:
        return ""
    return raw.decode(errors="replace")


def decisions(client: docker.DockerClient, egress: Egress, since: float, run_id: str) -> list[dict[str, Any]]:
    """The proxy's decisions since `since` (a time.time()), each tagged with `run_id`, in
    the shared egress record's shape (the records package's egress module). [] when the proxy is gone."""
    return _decisions_in(_logs(client, egress, since), since, run_id)


def _decisions_in(text: str, since: float, run_id: str) -> list[dict[str, Any]]:
    began = datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    out = []
    for line in text.splitlines():
        if not line.startswith(LINE_MARK):
            continue
        try:
            record = json.loads(line[len(LINE_MARK) :])
        except ValueError:
            continue
        if isinstance(record, dict) and str(record.get("time", "")) >= began:
            out.append({"time": record["time"], "run_id": run_id, **{k: v for k, v in record.items() if k != "time"}})
    return out


def docker_subnets(*networks: Network) -> tuple[str, ...]:
    """The subnets the engine gave `networks` (IPv4 and IPv6), from their inspect."""
    found = []
    for net in networks:
        net.reload()
        for conf in (net.attrs.get("IPAM") or {}).get("Config") or []:
            if conf.get("Subnet") and conf["Subnet"] not in found:
                found.append(conf["Subnet"])
    return tuple(found)


def _wait_for_log(container: Container, text: str, what: str) -> None:
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


EGRESS_FILE = "egress.jsonl"  # in state/: the shared contract's file (the records package's egress module owns it)


# -- finding and removing ------------------------------------------------------------


def started() -> bool:
    """Whether this process created allowlist plumbing that `shutdown` should remove."""
    return bool(_started)


LIST_ATTEMPTS = 5  # the SDK's list inspects each container it found; another process may remove one between


def leftovers(client: docker.DockerClient) -> tuple[list[Container], list[Network]]:
    """(containers, networks) labelled by this module, from any process."""
    for attempt in range(LIST_ATTEMPTS):
        try:
            containers = client.containers.list(all=True, filters={"label": f"{LABEL}=1"})
            networks = client.networks.list(filters={"label": f"{LABEL}=1"})
            return containers, networks
        except docker.errors.NotFound:
            if attempt + 1 == LIST_ATTEMPTS:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


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


def _quiet(action: Callable[..., object], **kwargs: object) -> int:
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
