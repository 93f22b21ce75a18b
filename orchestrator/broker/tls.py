"""The broker's wire over TCP with mutual TLS: the stack's certificates, and the two contexts.

Past one host the orchestrator reaches each node's broker over the network
(a swarm's overlay, which these kernels cannot encrypt: ../shared notes,
docs/scale-out.md), so the same lines as on the unix socket (wire.py) go
over TLS 1.3, and each side proves who it is with a certificate from a CA
made for the stack (`make_certs`, `wakeloop swarm certs DIR`):

- the broker's certificate names `wakeloop-broker` and may only serve
  (extended key usage serverAuth); the orchestrator checks the chain and that
  name, whatever address it dialled (`tasks.broker` resolves to the tasks'
  addresses, which no certificate could list);
- the orchestrator's names `wakeloop-orchestrator` and may only be a client
  (clientAuth); the broker asks for it, checks its chain (OpenSSL refuses a
  serverAuth-only certificate as a client's) and its name, and a connection
  without it, with another CA's, or with the broker's own gets nothing: not
  a reply, not a line, only a closed connection and a line in the broker's
  log. A certificate copied without its key proves nothing (TLS 1.3 signs
  the handshake with the key), so one taken from elsewhere cannot be replayed.

A taken-over orchestrator holds its own key: over TLS it is bounded exactly
as on the unix socket (the broker checks every request against the agent's
policy and the ceiling). The CA's key stays with whoever made the files
(`ca.key`, 0600): it is never one of the stack's secrets, so no service can
mint a certificate.

Files, named as a swarm mounts its secrets (/run/secrets/NAME), in one folder
($WAKELOOP_TLS_DIR, or `wakeloop broker --tls-dir`): wakeloop-ca.pem, and
wakeloop-broker.{pem,key} for the broker, wakeloop-orchestrator.{pem,key} for
the orchestrator. Made with the host's openssl command (Python's ssl reads
certificates but cannot make them); P-256 keys.

Not here: the lines themselves (wire.py), serving (transport.py).
"""

from __future__ import annotations

import functools
import os
import socket
import ssl
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from orchestrator.errors import ConfigError

SCHEME = "tls://"  # WAKELOOP_BROKER=tls://HOST:PORT: this transport; else a unix socket
TLS_DIR_ENV = "WAKELOOP_TLS_DIR"
BROKER_NAME = "wakeloop-broker"
ORCHESTRATOR_NAME = "wakeloop-orchestrator"
CA = "wakeloop-ca.pem"
CA_KEY = "ca.key"  # stays with whoever made the files; never a secret of the stack
DAYS = 825  # the longest a TLS client (Apple's) accepts for a leaf
CONNECT_TIMEOUT_S = 10.0
ROLES = {BROKER_NAME: "serverAuth", ORCHESTRATOR_NAME: "clientAuth"}


class TLSConfigError(ConfigError):
    """The certificates are missing, unreadable or cannot be made: one line, with the fix."""


def host_port(address: str) -> tuple[str, int]:
    """`tls://HOST:PORT` (HOST may be [v6]) as (host, port), or TLSConfigError."""
    rest = address[len(SCHEME) :] if address.startswith(SCHEME) else ""
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port (a listener)
        raise TLSConfigError(f"a broker address over TLS is tls://HOST:PORT, not {address!r:.80}")
    return host.strip("[]"), int(port)


def files(folder: Path, name: str) -> tuple[Path, Path, Path]:
    """(the CA's certificate, `name`'s certificate, its key) in `folder`, each checked readable."""
    paths = (folder / CA, folder / f"{name}.pem", folder / f"{name}.key")
    for path in paths:
        if not os.access(path, os.R_OK):
            raise TLSConfigError(
                f"{path}: missing or unreadable; make the stack's certificates with "
                f"`wakeloop swarm certs DIR` and give {name} its files"
            )
    return paths


def server_context(folder: Path) -> ssl.SSLContext:
    """The broker's, made once per set of files: renewed files (a new mtime) make a new one."""
    return _cached(make_server_context, folder, _stamps(files(folder, BROKER_NAME)))


def client_context(folder: Path) -> ssl.SSLContext:
    """The orchestrator's, made once per set of files, as server_context."""
    return _cached(make_client_context, folder, _stamps(files(folder, ORCHESTRATOR_NAME)))


# (inode, mtime) of each file a context was made from: a new file makes a new context.
Stamps = tuple[tuple[int, int], ...]


@functools.lru_cache(maxsize=8)
def _cached(make: Callable[[Path], ssl.SSLContext], folder: Path, stamps: Stamps) -> ssl.SSLContext:
    return make(folder)


def _stamps(paths: Iterable[Path]) -> Stamps:
    return tuple((os.stat(path).st_ino, os.stat(path).st_mtime_ns) for path in paths)


def make_server_context(folder: Path) -> ssl.SSLContext:
    """The broker's side: its certificate; a client certificate of the stack's CA required."""
    ca, cert, key = files(folder, BROKER_NAME)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(cert, key)
    context.load_verify_locations(ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def make_client_context(folder: Path) -> ssl.SSLContext:
    """The orchestrator's side: its certificate; the broker's checked against the CA and its name."""
    ca, cert, key = files(folder, ORCHESTRATOR_NAME)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname and CERT_REQUIRED
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(cert, key)
    context.load_verify_locations(ca)
    return context


def tls_dir(environ: Mapping[str, str] = os.environ) -> Path:
    value = environ.get(TLS_DIR_ENV, "").strip()
    if not value:
        raise TLSConfigError(
            f"a broker at tls://... needs {TLS_DIR_ENV}: the folder with {CA} and "
            f"{ORCHESTRATOR_NAME}.pem/.key (/run/secrets under a swarm)"
        )
    return Path(value)


# A broker's node lost mid-call sends nothing, not even a reset: without probes a call
# waits out its own timeout (minutes). Idle 5 s, then 3 probes 2 s apart: lost in ~11 s.
# Keepalive does not probe while data is unacknowledged: a request sent as the node went
# (the swarm lab: into a broker whose task's network was gone) was retransmitted for the
# kernel's ~15 minutes (tcp_retries2), its wake hung that long. Unacknowledged 11 s: lost.
KEEPALIVE = ((socket.SO_KEEPALIVE, 1),)
KEEPALIVE_TCP = (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", 11_000))


def _keepalive(sock: socket.socket) -> None:
    for option, value in KEEPALIVE:
        sock.setsockopt(socket.SOL_SOCKET, option, value)
    for name, value in KEEPALIVE_TCP:
        if hasattr(socket, name):  # Linux; elsewhere the system's defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def connect(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> ssl.SSLSocket:
    """A connection to the broker at `address`, the handshake done and the broker proven."""
    host, port = host_port(address)
    context = client_context(tls_dir())
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        _keepalive(sock)
        return context.wrap_socket(sock, server_hostname=BROKER_NAME)
    except BaseException:
        sock.close()
        raise


def accept(sock: socket.socket, context: ssl.SSLContext, timeout_s: float) -> ssl.SSLSocket:
    """The broker's side of a new connection: the handshake within `timeout_s`, and the client
    proven to be the orchestrator; ssl.SSLError (or OSError) otherwise. `sock` is taken over."""
    sock.settimeout(timeout_s)
    tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    try:
        tls.do_handshake()
        alt_names = (tls.getpeercert() or {}).get("subjectAltName", ())  # ((kind, value), ...)
        names = [pair[1] for pair in alt_names if isinstance(pair, tuple) and pair[0] == "DNS"]
        if names != [ORCHESTRATOR_NAME]:
            raise ssl.SSLError(f"the client's certificate names {names or 'nothing'}, not {ORCHESTRATOR_NAME}")
    except BaseException:
        tls.close()
        raise
    return tls


def make_certs(folder: Path, days: int = DAYS) -> list[Path]:
    """A CA and the two certificates in `folder` (made 0700), keys 0600. Refuses to overwrite:
    a stack's CA made anew would lock out every node that has the old one."""
    made = [folder / CA, folder / CA_KEY] + [folder / f"{n}.{ext}" for n in ROLES for ext in ("pem", "key")]
    there = [path.name for path in made if path.exists()]
    if there:
        raise TLSConfigError(
            f"{folder} has {', '.join(there)} already; certificates are never made over "
            "others (move them away to start a new CA)"
        )
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    old = os.umask(0o077)
    try:
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            folder / CA_KEY,
            "-out",
            folder / CA,
            "-days",
            str(days),
            "-subj",
            "/CN=wakeloop stack CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        )
        for name, usage in ROLES.items():
            _leaf(folder, name, usage, days)
    finally:
        os.umask(old)
    for path in made:
        path.chmod(0o600 if path.suffix == ".key" else 0o644)
    return made


def _leaf(folder: Path, name: str, usage: str, days: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        request, extensions = Path(scratch) / "req.csr", Path(scratch) / "ext.cnf"
        extensions.write_text(
            f"subjectAltName=DNS:{name}\nextendedKeyUsage={usage}\n"
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        )
        _openssl(
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            folder / f"{name}.key",
            "-out",
            request,
            "-subj",
            f"/CN={name}",
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            request,
            "-CA",
            folder / CA,
            "-CAkey",
            folder / CA_KEY,
            "-set_serial",
            str(int.from_bytes(os.urandom(16), "big")),
            "-days",
            str(days),
            "-extfile",
            extensions,
            "-out",
            folder / f"{name}.pem",
        )


def _openssl(*argv: str | Path) -> None:
    try:
        done = subprocess.run(["openssl", *map(str, argv)], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise TLSConfigError("making certificates needs the openssl command (Debian: apt install openssl)") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise TLSConfigError(f"openssl {argv[0]} failed: {why}")
