"""Attacks on the broker's wire over TCP with mutual TLS (broker/tls.py).

The attacker is a peer on the network between the hosts (actor E in the
docs/security.md's threat model: another container on a swarm's overlay, which these
kernels cannot encrypt), who can reach the broker's port and may hold
certificates of its own, or one of ours without its key. Each attempt
connects to a real broker listening on 127.0.0.1 with the stack's
certificates, made for the trial, and asks it to run a command for an agent;
it must get nothing back: no reply line, whatever the handshake says.

Not here: what the orchestrator may ask once proven (broker_probes.py's probes).
"""

from __future__ import annotations

import json
import socket
import ssl
from pathlib import Path

from orchestrator.broker import tls
from orchestrator.escapes.broker_probes import ServedBroker
from orchestrator.escapes.lab import Probe, Trial, escaped, held

CATEGORY = "surfaces"
ASK = json.dumps({"op": "run", "agent": "alpha", "command": "echo served"}).encode() + b"\n"
TIMEOUT_S = 10.0


def _context(ca: Path | None, cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    """A client context that trusts `ca` (None: anything) and presents `cert` (None: nothing)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca is None:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    else:
        context.load_verify_locations(ca)
    if cert is not None:
        context.load_cert_chain(*cert)
    return context


def _answer(address: str, context: ssl.SSLContext | None) -> bytes:
    """What the broker at `address` sends back to ASK over `context` (None: plain TCP)."""
    host, port = tls.host_port(address)
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT_S) as raw:
            sock = context.wrap_socket(raw, server_hostname=tls.BROKER_NAME) if context else raw
            with sock:
                sock.sendall(ASK)
                return sock.makefile("rb").readline(65536)
    except (ssl.SSLError, OSError):
        return b""


def _tls_answers_only_the_orchestrator(t: Trial) -> str:
    from orchestrator.policy.agent import init_agent
    from orchestrator.policy.ceiling import Ceiling

    ours, theirs = t.dir / "certs", t.dir / "foreign"
    tls.make_certs(ours)
    tls.make_certs(theirs)
    root = t.dir / "root"
    init_agent(root / "alpha")
    served = ServedBroker(root, t.lab.client, Ceiling(source="the probe's ceiling"), tls_dir=ours)
    ca = ours / tls.CA

    def pair(folder: Path, name: str) -> tuple[Path, Path]:
        return folder / f"{name}.pem", folder / f"{name}.key"

    try:
        attempts = {
            "plain TCP": None,
            "TLS with no certificate": _context(ca, None),
            "another CA's orchestrator certificate": _context(ca, pair(theirs, tls.ORCHESTRATOR_NAME)),
            "the broker's own certificate as a client's": _context(ca, pair(ours, tls.BROKER_NAME)),
        }
        answered = {name: _answer(served.address, context) for name, context in attempts.items()}
        proven = _answer(served.address, _context(ca, pair(ours, tls.ORCHESTRATOR_NAME)))
    finally:
        served.close()
    if b'"ok": true' not in proven:
        # Neither line: INCONCLUSIVE, a failure too (silence proves nothing).
        return f"the orchestrator's own certificate was not served either: {proven[:200]!r}\n"
    got = [f"{name}: {reply[:120]!r}" for name, reply in answered.items() if reply]
    if got:
        return escaped("the broker answered a client that is not the stack's orchestrator: " + "; ".join(got))
    refused = sum(1 for line in served.lines if line.startswith("refused a connection from"))
    return held(
        f"plain TCP, no certificate, another CA's and the broker's own certificate got nothing "
        f"back ({refused} refusals in the broker's log); the orchestrator's certificate was served"
    )


broker_tls_answers_only_the_orchestrator = Probe(
    "broker_tls_answers_only_the_orchestrator",
    CATEGORY,
    "over TCP the broker answers only a client with the stack's orchestrator certificate and its key",
    _tls_answers_only_the_orchestrator,
)

PROBES = [broker_tls_answers_only_the_orchestrator]
