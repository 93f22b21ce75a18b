"""Network attacks: find any way out of a box whose policy says `network: none`.

No probe here ever sends a packet beyond this machine, even in a weakened box
that has a network. "No way out" is read from the box's interfaces and routing
table, or from a UDP connect() (a route lookup that sends nothing). The only
TCP connects go to the host's own addresses (the bridge gateway, the host's
interfaces), where a reply of any kind, refusal included, proves a path.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import threading

import docker.errors

from orchestrator.escapes.core import Probe, Trial, observed, python_command

CATEGORY = "network"
DOCKER_API_PORTS = (2375, 2376)  # the engine's plain and TLS TCP ports
METADATA_ADDRESS = "169.254.169.254"
CONNECT_TIMEOUT_S = 2  # a connect to the host's own address answers in ms; 2 s bounds a drop


def _py(name: str, expected: str, program: str) -> Probe:
    return Probe(name, CATEGORY, expected, lambda t: t.py(program))


def _interfaces(t: Trial) -> str:
    # network: allowlist puts the box in a namespace with one interface, on the
    # agent's internal network where only its proxy answers (the allowlist probes).
    allowed = 1 if t.lab.policy.network == "allowlist" else 0
    return t.py(rf"""
names = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
if not names:
    names = [l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]]
others = [n for n in names if n != "lo"]
if len(others) > {allowed}: escaped(f"interfaces besides lo: {{others}}")
else: held(f"interfaces: {{names}}" + (" (one to the allowlist's proxy network)" if others else ""))
""")


has_no_interface_but_lo = Probe(
    "has_no_interface_but_lo",
    CATEGORY,
    "the only network interface is lo (under an allowlist, one more: to its proxy's internal network)",
    _interfaces,
)

has_no_default_route = _py(
    "has_no_default_route",
    "the routing tables (IPv4 and IPv6) hold no default route and no gateway",
    r"""
routes, local = [], []
try:
    for line in open("/proc/net/route").readlines()[1:]:
        f = line.split()
        if not f or f[0] == "lo": continue
        # dst 0 is a default route; a gateway leads off the link. A link route
        # alone (an allowlist's internal network) reaches only that network.
        (routes if f[1] == "00000000" or f[2] != "00000000" else local).append(f"{f[0]} dst {f[1]} gw {f[2]}")
except OSError:
    pass
try:
    for line in open("/proc/net/ipv6_route"):
        f = line.split()
        if not f or f[-1] == "lo": continue
        (routes if f[1] == "00" or f[4] != "0" * 32 else local).append(f"v6 {f[0]}/{f[1]} via {f[-1]}")
except OSError:
    pass
if routes: escaped("routes off the box: " + "; ".join(routes[:4]))
else: held("no default route and no gateway" + (f"; link routes only: {local[:2]}" if local else ""))
""",
)


def _udp_route_probe(targets: str, what: str) -> str:
    """A UDP connect() only looks up a route: no packet is sent, in any box.
    `targets` is Python source for a list of (address, port)."""
    return rf"""
routed = []
for host, port in {targets}:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM)
    try:
        s.connect((host, port)); routed.append(f"{{host}}:{{port}}")
    except OSError as exc:
        pass
    finally:
        s.close()
if routed: escaped("a route exists to " + ", ".join(routed))
else: held("no route to {what} (connect fails locally: network unreachable)")
"""


def _dns(t: Trial) -> str:
    program = r"""
servers = []
try:
    servers = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")]
except OSError:
    pass
""" + _udp_route_probe(
        "[(s, 53) for s in servers + ['1.1.1.1', '8.8.8.8'] if not s.startswith(('127.', '::1'))]", "any nameserver"
    )
    return t.py(program)


has_no_dns = Probe(
    "has_no_dns",
    CATEGORY,
    "no route to the configured nameservers or a public resolver (the box's own lo aside; no query sent)",
    _dns,
)

has_no_route_to_metadata = Probe(
    "has_no_route_to_metadata",
    CATEGORY,
    f"no route to the cloud metadata address {METADATA_ADDRESS}",
    lambda t: t.py(_udp_route_probe(repr([(METADATA_ADDRESS, 80), ("fd00:ec2::254", 80)]), "the metadata service")),
)


def host_addresses(client) -> list[str]:
    """The host's own addresses: every Docker network gateway and the host's interfaces."""
    found = set()
    try:
        for net in client.networks.list():
            for conf in (net.attrs.get("IPAM") or {}).get("Config") or []:
                if conf.get("Gateway"):
                    found.add(conf["Gateway"])
    except docker.errors.APIError:
        pass
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None):
            found.add(info[4][0])
    except OSError:
        pass
    found.update(_interface_addresses())
    found.add("127.0.0.1")  # inside the box this is its own lo, never the host
    return sorted(a for a in found if ipaddress.ip_address(a).version == 4)


def _interface_addresses() -> set[str]:
    """IPv4 addresses of the host's interfaces (SIOCGIFADDR), without a subprocess."""
    import fcntl
    import struct

    found = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                found.add(socket.inet_ntoa(packed[20:24]))
            except OSError:
                pass  # an interface without an IPv4 address
    return found


def _tcp_to_host(ports: tuple[int, ...], what: str):
    def attack(t: Trial) -> str:
        targets = [(a, p) for a in host_addresses(t.lab.client) if a != "127.0.0.1" for p in ports]
        program = rf"""
reached = []
for host, port in {targets!r}:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout({CONNECT_TIMEOUT_S})
    try:
        s.connect((host, port)); reached.append(f"{{host}}:{{port}} accepted")
    except ConnectionRefusedError:
        reached.append(f"{{host}}:{{port}} answered (refused)")   # the host replied: a path exists
    except OSError:
        pass
    finally:
        s.close()
if reached: escaped("; ".join(reached))
else: held("the host's addresses {sorted({a for a, _ in targets})} are unreachable on {what}")
"""
        return t.py(program)

    return attack


cannot_reach_bridge_gateway = Probe(
    "cannot_reach_bridge_gateway",
    CATEGORY,
    "TCP to the Docker gateways (the host's own address) fails locally",
    _tcp_to_host((22, 80, 443, 8080), "ports 22/80/443/8080"),
)

cannot_reach_docker_api_tcp = Probe(
    "cannot_reach_docker_api_tcp",
    CATEGORY,
    "the Docker API on TCP 2375/2376 of every host address is unreachable",
    _tcp_to_host(DOCKER_API_PORTS, "the Docker API ports"),
)

blocks_raw_and_packet_sockets = _py(
    "blocks_raw_and_packet_sockets",
    "raw and packet sockets cannot be opened (no CAP_NET_RAW)",
    r"""
made = []
for fam, typ, proto, name in [(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, "raw ICMP"),
                              (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW, "raw IP"),
                              (socket.AF_PACKET, socket.SOCK_RAW, 0, "packet")]:
    try:
        socket.socket(fam, typ, proto).close(); made.append(name)
    except OSError:
        pass
# an ICMP echo to the box's own loopback (never leaves the box): allowed or not, it is local
note = "ping socket unavailable"
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP); s.settimeout(1)
    s.sendto(b"\x08\x00\x00\x00\x00\x01\x00\x01", ("127.0.0.1", 0)); s.recv(64); note = "loopback ping answered by lo"
except OSError:
    pass
if made: escaped("opened " + ", ".join(made) + " sockets")
else: held(f"raw and packet sockets refused; {note}")
""",
)

# Two boxes of one sandbox alive at once. Under gVisor they share one empty host namespace
# (sandbox/egress/netns.py), which only each Sentry's own network stack should hide.
_LISTENER = r"""
import time
tcp = socket.socket(); tcp.bind(("127.0.0.1", 0)); tcp.listen(4); tcp.settimeout(0.05)
uds = socket.socket(socket.AF_UNIX); uds.bind("\0" + NAME); uds.listen(4); uds.settimeout(0.05)
open(NAME + ".up", "w").write(str(tcp.getsockname()[1]))
accepted, end = [], time.monotonic() + WAIT_S
while time.monotonic() < end and not os.path.exists(NAME + ".done"):
    for s, kind in ((tcp, "tcp"), (uds, "unix")):
        try:
            s.accept(); accepted.append(kind)
        except OSError:
            pass
print("accepted:", accepted)
"""
_CONNECTOR = r"""
port, reached = int(open(NAME + ".up").read()), []
for family, address, what in ((socket.AF_INET, ("127.0.0.1", port), f"tcp 127.0.0.1:{port}"),
                              (socket.AF_UNIX, "\0" + NAME, "an abstract unix socket")):
    s = socket.socket(family); s.settimeout(2)
    try:
        s.connect(address); reached.append(what)
    except OSError:
        pass
    s.close()
open(NAME + ".done", "w").close()
if reached: escaped("another box's listener reached over loopback: " + ", ".join(reached))
else: held("another box's listeners (tcp on 127.0.0.1, an abstract unix socket) refused: its loopback is its own")
"""
LISTEN_S = 60  # the listener's box stands at most this long, waiting for the other's verdict


def _boxes_share_no_loopback(t: Trial) -> str:
    """The first box listens and says so in the workspace both mount; only then does the
    second connect: no timing guess. The first gives up after LISTEN_S."""
    name = "wakeloop-lo-" + secrets.token_hex(4)
    head, up = f"NAME = {name!r}\nWAIT_S = {LISTEN_S}\n", t.box.view / (name + ".up")
    first: list[str] = []
    listener = threading.Thread(target=lambda: first.append(observed(t.run(python_command(head + _LISTENER)))))
    listener.start()
    while listener.is_alive() and not up.exists():
        listener.join(0.05)  # its box starting: until it ends, or writes that it listens
    if not up.exists():
        listener.join()
        return "the listening box never listened: " + "".join(first)
    try:
        return t.py(head + _CONNECTOR)
    finally:
        listener.join()


boxes_share_no_loopback = Probe(
    "boxes_share_no_loopback",
    CATEGORY,
    "a box reaches no listener of another box of the same agent alive at the same time (tcp on 127.0.0.1, "
    "an abstract unix socket): under gVisor, where they share one host namespace, each has its own loopback",
    _boxes_share_no_loopback,
)

PROBES = [
    has_no_interface_but_lo,
    has_no_default_route,
    has_no_dns,
    has_no_route_to_metadata,
    cannot_reach_bridge_gateway,
    cannot_reach_docker_api_tcp,
    blocks_raw_and_packet_sockets,
    boxes_share_no_loopback,
]

# Safe to run in a box that does have a network (the weakened controls do):
# they read tables, look up routes with UDP connect()s that send nothing, or
# dial only this host's own addresses.
LOCAL_ONLY = {
    "has_no_interface_but_lo",
    "has_no_default_route",
    "has_no_dns",
    "has_no_route_to_metadata",
    "cannot_reach_bridge_gateway",
    "cannot_reach_docker_api_tcp",
}
