# The egress proxy's one addon (mitmproxy 8.1.1, Debian bookworm's python3): every
# decision about one agent's traffic. Config is JSON in $WAKELOOP_EGRESS_CONF, written
# by orchestrator/sandbox/egress/network.py (proxy_config); credential values arrive as
# $WAKELOOP_SECRET_<VAR> and are popped from the environment at load. Not here: the
# config's meaning (network.py's docstring), the netns holder (programs.HOLDER_SCRIPT).
#
# Order of checks, per connection (CONNECT) and per plain-HTTP or intercepted request:
# an IP literal or a name not on the list is refused before any DNS lookup (a name that an
# approve.rules network_host glob covers is refused as "ask": a person decides); then the
# budget; then, for intercepted hosts, that every name for the destination is the tunnel's
# host (TLS, SNI, absolute-form target, Host), the path's normal form, the method/path rules
# and the placeholders; then, the whole body held, the budget again (request, response). The
# address a listed name resolves to is checked where the socket is made (_connect): one
# lookup, and the socket goes to the address that was checked (no rebinding between).
# Upstream TLS is named (SNI) and verified as the CONNECT host whatever the box's ClientHello
# said: tls_clienthello runs before mitmproxy opens upstream TLS (ServerTLSLayer waits for it).
import asyncio
import fnmatch
import ipaddress
import json
import os
import re
import signal
import socket
import sys
import time

import mitmproxy.proxy.server as proxy_server
from mitmproxy import ctx, http
from mitmproxy.proxy.layers import tcp

CONF = json.loads(os.environ.pop("WAKELOOP_EGRESS_CONF"))
SECRETS = {
    k[len("WAKELOOP_SECRET_") :]: os.environ.pop(k) for k in list(os.environ) if k.startswith("WAKELOOP_SECRET_")
}
BLOCKED = [ipaddress.ip_network(n) for n in CONF["blocked"]]
PRIVATE_OK = set(CONF.get("private_ok", []))  # names a test may resolve to a private address (network.py)
INTERCEPT = CONF["intercept"]  # host -> {"credentials": [...], "allow": [...] or None, "where": str}
PLACEHOLDERS = {
    c["placeholder"]: (c["placeholder_env"], host)
    for host, v in INTERCEPT.items()
    for c in v["credentials"]
    if c["placeholder"]
}
BUDGET = CONF.get("budget", 0)
ASK = CONF.get("ask", [])  # approve.rules' network_host globs: an unlisted name that matches asks a person
# Each check below is on unless the config turns it off (only a test's weakened config does).
CHECK_SNI = CONF.get("check_sni", True)  # a tunnel's TLS name is its CONNECT host, and so is upstream's
CHECK_AUTHORITY = CONF.get("check_authority", True)  # an absolute-form target names the tunnel's host
CHECK_TLS = CONF.get("check_tls", True)  # an intercepted tunnel carries TLS only
CHECK_PATHS = CONF.get("check_paths", True)  # a ruled path is already in normal form
RECORD_ONCE = CONF.get("record_once", True)  # a refused request's line is its only line
CUT_AT_BUDGET = CONF.get("cut_at_budget", True)  # the budget ends a transfer in flight, not only the next one
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(template):
    return _VAR.sub(lambda m: SECRETS.get(m.group(1), ""), template)


def scrub(text):
    """Whatever reaches the box or the record never holds a credential's value."""
    for value in SECRETS.values():
        if value:
            text = text.replace(value, "[secret]")
    return text


def listed(host, port):
    """The allow_hosts entry that admits host:port, or None. Names only: no DNS here.
    A name of "*" admits anything (only a test's weakened config has one)."""
    for wildcard, name, want in CONF["allow"]:
        if name == "*":
            return "*"
        if want is None and port not in (80, 443) or want is not None and port != want:
            continue
        if (host.endswith("." + name) and re.fullmatch(r"[a-z0-9.-]+", host)) if wildcard else host == name:
            return ("*." if wildcard else "") + name + (f":{want}" if want else "")
    return None


def is_ip(host):
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def path_rule(method, path, rules):
    """The rule ('GET /repos/**') that admits method and path, or None. `*` is one segment, `**` any."""
    path = path.split("?", 1)[0]
    for rule in rules:
        want, _, pattern = rule.partition(" ")
        if want not in ("*", method):
            continue
        regex = "".join(
            ".*" if part == "**" else "[^/]*" if part == "*" else re.escape(part)
            for part in re.split(r"(\*\*|\*)", pattern)
        )
        if re.fullmatch(regex, path):
            return rule
    return None


_UNRESERVED = re.compile(r"%(4[1-9A-Fa-f]|5[0-9Aa]|6[1-9A-Fa-f]|7[0-9Aa]|3[0-9]|2[DEde]|5[Ff]|7[Ee])")


def normal_path(path):
    """RFC 3986's normal form of a path (no query): percent-encoded unreserved characters
    decoded, then dot segments removed (section 5.2.4)."""
    decoded = _UNRESERVED.sub(lambda m: chr(int(m.group(1), 16)), path)
    out = []
    for segment in decoded.split("/")[1:]:
        if segment == "..":
            out = out[:-1]
        elif segment != ".":
            out.append(segment)
    tail = "/" if decoded.rsplit("/", 1)[-1] in (".", "..") else ""
    return "/" + "/".join(out) + tail if out else "/"


def path_trouble(path):
    """Why a ruled host's path is refused as sent, or "": the server might read it otherwise."""
    bare = path.split("?", 1)[0]
    if re.search(r"%(2[Ff]|5[Cc])|\\", bare):
        return "an encoded slash or a backslash in the path"
    if normal_path(bare) != bare:
        return f"the path is not in normal form (it reads as {normal_path(bare)})"
    return ""


async def resolve(host, port):
    """The address to connect to for host: every address it resolves to must be public
    (or the name one a test let reach a private address); OSError says why not."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [info[4][0] for info in infos]
    if not addresses:
        raise OSError(f"{host} has no address")
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        private = not ip.is_global or any(ip in net for net in BLOCKED if net.version == ip.version)
        if private and CONF.get("check_addresses", True) and host not in PRIVATE_OK:
            raise OSError(f"{host} resolves to {address}, which is not a public address")
    return addresses[0]


async def _connect(host, port, **kwargs):
    """asyncio.open_connection for mitmproxy's server connections: resolve once, check,
    and connect to the address that was checked (no second lookup to rebind)."""
    return await asyncio.open_connection(await resolve(host, port), port, **kwargs)


class _Asyncio:
    """mitmproxy's server module sees this as `asyncio`: the real one but for open_connection."""

    def __getattr__(self, name):
        return _connect if name == "open_connection" else getattr(asyncio, name)


proxy_server.asyncio = _Asyncio()


class Conn:
    def __init__(self, host, port, rule, intercepted):
        self.host, self.port, self.rule, self.intercepted = host, port, rule, intercepted
        self.sni = None  # the TLS name the box gave (intercepted tunnels)
        self.up = self.down = 0
        self.layered = False
        self.over = False


class Egress:
    def __init__(self):
        self.conns = {}  # client connection id -> Conn, for CONNECT tunnels
        self.spent = 0  # bytes both ways since the wake began (SIGUSR1)

    def running(self):
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self.new_wake)
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, self.mark)
        # The CA's certificate (never its key) for the host to hand the box; then ready.
        with open(os.path.join(ctx.options.confdir, "mitmproxy-ca-cert.pem")) as f:
            pem = f.read()
        print("wakeloop-egress: ca " + pem.replace("\n", "|"), flush=True)
        print("wakeloop-egress: ready", flush=True)

    def new_wake(self):
        self.spent = 0
        print("wakeloop-egress: new wake", flush=True)  # what a caller may wait for

    def mark(self):
        # Every decision before it is in the log before it; its time says which calls it covers (network.asked).
        print(f"wakeloop-egress: mark {time.time():.6f}", flush=True)

    # -- records ---------------------------------------------------------------------

    def record(self, host, port, method, path, decision, rule, intercepted=False, credential="", up=0, down=0):
        now = time.time()
        line = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z",
            "host": host,
            "port": port,
            "method": method,
            "path": scrub(path)[:2000],
            "decision": decision,
            "rule": scrub(rule),
            "intercepted": intercepted,
            "credential": credential,
            "bytes_up": up,
            "bytes_down": down,
        }
        sys.stdout.write("wakeloop-egress " + json.dumps(line) + "\n")
        sys.stdout.flush()

    def refuse(self, flow, host, port, path, rule, why, intercepted=False, decision="deny"):
        body = scrub(f"wakeloop egress: refused {flow.request.method} {host}:{port}{path}: {why}\n").encode()
        flow.response = http.Response.make(403, body, {"Content-Type": "text/plain"})
        up = len(bytes(flow.request.headers)) + len(flow.request.raw_content or b"")
        self.record(host, port, flow.request.method, path, decision, rule, intercepted, up=up, down=len(body))
        if RECORD_ONCE:
            flow.metadata["wakeloop_done"] = True  # its one line: done() writes no second

    def over_budget(self):
        return BUDGET and self.spent >= BUDGET

    def past_budget(self, size):
        """Whether `size` more bytes would take this wake past its budget."""
        return bool(BUDGET) and CUT_AT_BUDGET and self.spent + size > BUDGET

    def cut(self, client, server=None):
        """End the box's connection now, and with it the upstream one (or only `server`, the box's
        own kept). mitmproxy 8.1.1 ignores flow.kill() on a TCP flow, so the reading task of that
        side is cancelled, as mitmproxy's own idle timeout does (proxy/server.py's on_timeout)."""
        for handler in ctx.master.addons.get("proxyserver")._connections.values():
            io = handler.transports.get(server or handler.client)
            if handler.client.id == client.id and io is not None and io.handler is not None:
                io.handler.cancel("egress budget")

    def budget_text(self):
        return f"egress budget {BUDGET}"

    # -- connections -------------------------------------------------------------------

    async def http_connect(self, flow):
        host, port = flow.request.host.lower().rstrip("."), flow.request.port
        if host in INTERCEPT and port != 443:  # a raw tunnel there would pass its rules by
            why = "its requests are ruled or carry a credential, which only HTTPS on port 443 gets"
            self.refuse(flow, host, port, "", "intercepted host, port not 443", why)
            return
        rule = await self.host_check(flow, host, port, "")
        if rule is None:
            return
        self.conns[flow.client_conn.id] = Conn(host, port, f"allow_hosts: {rule}", host in INTERCEPT and port == 443)

    async def host_check(self, flow, host, port, path):
        """The allow_hosts entry, or None after refusing the flow."""
        if is_ip(host) and listed(host, port) != "*":
            self.refuse(flow, host, port, path, "IP address", "an IP address; name the host in sandbox.allow_hosts")
            return None
        rule = listed(host, port)
        nameable = rule is None and re.fullmatch(r"[a-z0-9.-]+", host)  # a name a grant can hold (parse_host)
        asked = next((g for g in ASK if fnmatch.fnmatchcase(host, g)), None) if nameable else None
        if asked is not None:
            why = (
                "the host is not in sandbox.allow_hosts, and this agent's policy asks a person about it "
                f"(approve.rules network_host {asked!r}): when this command ends it is filed for approval; "
                "approved, the same command runs again at a later wake with this host allowed"
            )
            self.refuse(flow, host, port, path, f"network_host {asked}", why, decision="ask")
            return None
        if rule is None:
            self.refuse(flow, host, port, path, "not in allow_hosts", "the host is not in sandbox.allow_hosts")
            return None
        if self.over_budget():
            self.refuse(flow, host, port, path, self.budget_text(), f"past this wake's {self.budget_text()} bytes")
            return None
        try:  # asked here to answer the box 403 with the reason; _connect asks again, and connects
            await resolve(host, port)
        except OSError as exc:
            self.refuse(flow, host, port, path, "not a public address", str(exc))
            return None
        return rule

    def next_layer(self, nextlayer):
        conn = self.conns.get(nextlayer.context.client.id)
        if conn and not conn.intercepted and not conn.layered:
            conn.layered = True  # a tunnel, passed untouched; a TCP flow of our own, to count its bytes
            nextlayer.layer = tcp.TCPLayer(nextlayer.context)

    def tcp_message(self, flow):
        conn = self.conns.get(flow.client_conn.id)
        message = flow.messages[-1]
        del flow.messages[:]  # counted, not kept: a download must not grow the proxy
        if conn is None:
            return
        past = self.past_budget(len(message.content))
        if past:  # what is left of the budget goes on, the rest never: the tunnel's bytes stop at the budget
            message.content = message.content[: max(0, BUDGET - self.spent)]
        if message.from_client:
            conn.up += len(message.content)
        else:
            conn.down += len(message.content)
        self.spent += len(message.content)
        if (past or self.over_budget()) and not conn.over:
            conn.over = True
            self.record(conn.host, conn.port, "CONNECT", "", "deny", self.budget_text(), up=conn.up, down=conn.down)
            if CUT_AT_BUDGET:
                self.cut(flow.client_conn)

    def tcp_end(self, flow):
        conn = self.conns.pop(flow.client_conn.id, None)
        if conn and not conn.over:
            self.record(conn.host, conn.port, "CONNECT", "", "allow", conn.rule, up=conn.up, down=conn.down)

    tcp_error = tcp_end

    def client_disconnected(self, client):
        conn = self.conns.get(client.id)
        if conn and conn.intercepted:  # no tcp_end comes for it (a tunnel's is recorded there): kept no longer
            del self.conns[client.id]

    def tls_clienthello(self, data):
        conn = self.conns.get(data.context.client.id)
        if conn and conn.intercepted:
            conn.sni = (data.client_hello.sni or "").lower().rstrip(".")
            if CHECK_SNI:  # upstream is named and verified as the tunnel's host, whatever the box said
                data.context.server.sni = conn.host

    def name_trouble(self, flow, conn):
        """Why a request in an intercepted tunnel is not plainly for the tunnel's host, or ""."""
        if CHECK_TLS and not flow.client_conn.tls_established:
            return f"clear text in a tunnel to {conn.host}:{conn.port}: only TLS goes there"
        if CHECK_SNI and flow.client_conn.tls_established and conn.sni != conn.host:
            return f"the TLS name (SNI) {conn.sni or 'none'!r} is not the tunnel's host {conn.host}"
        if CHECK_SNI and flow.server_conn.sni not in (None, conn.host):
            return f"upstream named {flow.server_conn.sni}, not {conn.host}"
        authority = flow.request.authority.lower()
        if CHECK_AUTHORITY and authority:
            named, _, port = authority.rpartition(":") if not authority.endswith("]") else (authority, "", "")
            named, port = (named, port) if port.isdigit() else (authority, "")
            if named.strip("[]").rstrip(".") != conn.host or port not in ("", str(conn.port)):
                return f"the request's target names {authority}, not the tunnel's host {conn.host}:{conn.port}"
        return ""

    # -- requests (plain HTTP, and inside intercepted tunnels) -----------------------

    async def requestheaders(self, flow):
        conn = self.conns.get(flow.client_conn.id)
        method, path = flow.request.method, flow.request.path
        if conn is None:  # plain HTTP through the proxy
            host, port = flow.request.host.lower().rstrip("."), flow.request.port
            if await self.host_check(flow, host, port, path) is None:
                return
            intercepted, tls = host in INTERCEPT, False
        else:
            host, port, intercepted, tls = conn.host, conn.port, True, flow.client_conn.tls_established or not CHECK_TLS
            trouble = self.name_trouble(flow, conn)
            if trouble:
                self.refuse(flow, host, port, path, "names differ", trouble, True)
                return
        # The name the request asks for (Host, or HTTP/2's authority) must be the host decided on: else
        # a credential could be sent, at the right address, to another name served there (domain fronting).
        asked = flow.request.host.lower().rstrip(".")
        named = (flow.request.host_header or "").lower().rsplit(":", 1)[0].strip("[]").rstrip(".") or host
        if intercepted and (asked != host or named != host or flow.request.port != port):
            why = f"a request for {named if named != host else asked} on a connection to {host}"
            self.refuse(flow, host, port, path, "host differs from tunnel", why, True)
            return
        if conn is not None:
            if self.over_budget():
                self.refuse(
                    flow, host, port, path, self.budget_text(), f"past this wake's {self.budget_text()} bytes", True
                )
                return
        flow.metadata["wakeloop"] = (host, port, intercepted)
        for placeholder, (name, bound) in PLACEHOLDERS.items():
            seen = placeholder in flow.request.url or any(placeholder in v for v in flow.request.headers.values())
            if seen and bound != host:
                rule = f"placeholder {name} sent to another host"
                self.refuse(flow, host, port, path, rule, f"{name} is bound to {bound}, not {host}", intercepted)
                return
        spec = INTERCEPT.get(host)
        if spec is None:
            flow.metadata["wakeloop_rule"] = "allow_hosts: " + (listed(host, port) or host)
            return
        rules = spec.get("allow")
        trouble = path_trouble(path) if CHECK_PATHS and rules is not None else ""
        if trouble:
            why = f"{trouble}: {host}'s rules are matched only on a path the server reads as sent"
            self.refuse(flow, host, port, path, "path not in normal form", why, intercepted)
            return
        rule = path_rule(method, path, rules) if rules is not None else None
        if rules is not None and rule is None:
            where = f" ({spec['where']})" if spec.get("where") else ""
            why = f"no rule of sandbox.http for {host} allows it (allow: {', '.join(rules)}){where}"
            self.refuse(flow, host, port, path, f"no rule for {method} {path.split('?', 1)[0]}", why, intercepted)
            return
        flow.metadata["wakeloop_rule"] = f"allow {rule}" if rule else "allow_hosts: " + (listed(host, port) or host)
        names = []
        for cred in spec["credentials"]:
            if not tls:
                self.refuse(
                    flow, host, port, path, "credential over plain http", "credentials go over https only", intercepted
                )
                return
            value = expand(cred["value"])
            for key, header in list(flow.request.headers.items()):
                if cred["placeholder"] and cred["placeholder"] in header:
                    flow.request.headers[key] = header.replace(cred["placeholder"], value)
            flow.request.headers[cred["header"]] = value
            names.append(cred["var"])
        flow.metadata["wakeloop_credential"] = ",".join(names)

    def request(self, flow):
        """The whole body is here (mitmproxy holds it, up to body_size_limit) and none of it has
        left: past the budget, none of it does."""
        if "wakeloop" not in flow.metadata or flow.metadata.get("wakeloop_done"):
            return
        up = len(bytes(flow.request.headers)) + len(flow.request.raw_content or b"")
        if self.past_budget(up):
            host, port, intercepted = flow.metadata["wakeloop"]
            why = f"sending {up} bytes would pass this wake's {self.budget_text()} bytes ({self.spent} spent)"
            self.refuse(flow, host, port, flow.request.path, self.budget_text(), why, intercepted)
            return
        self.spent += up  # counted as it leaves: uploads side by side cannot each take what is left
        flow.metadata["wakeloop_spent"] = up

    def responseheaders(self, flow):
        """An answer whose Content-Length would pass the budget is refused before its body is read:
        the box gets a 403 saying why in its place, sent when the first piece of the body comes,
        and upstream's connection is closed then (at most one read, 64 KiB, past the budget)."""
        if "wakeloop" not in flow.metadata or flow.metadata.get("wakeloop_done"):
            return
        size = flow.response.headers.get("content-length", "")
        down = len(bytes(flow.response.headers)) + int(size) if size.isdigit() else 0
        if not size.isdigit() or flow.request.is_http2 or not self.past_budget(down):
            # Unknown length, or a box speaking HTTP/2 (whose stream the cut would reset before its
            # end, the reason unread): held whole, and judged at response.
            return
        host, port, intercepted = flow.metadata["wakeloop"]
        why = f"its answer's {down} bytes would pass this wake's {self.budget_text()} bytes"
        self.refuse(flow, host, port, flow.request.path, self.budget_text(), why, intercepted)
        reason, told = flow.response.content, []
        flow.response.content = None  # the head goes now; the reason follows as the body streamed
        flow.response.headers["Content-Length"] = str(len(reason))

        def only_the_reason(piece):
            if told:
                return b""
            told.append(True)
            self.cut(flow.client_conn, flow.server_conn)  # upstream's answer read no further
            return reason

        flow.response.stream = only_the_reason

    def response(self, flow):
        """The whole answer is here and none of it has reached the box: past the budget, the box
        gets the reason instead."""
        if "wakeloop" in flow.metadata and not flow.metadata.get("wakeloop_done"):
            down = len(bytes(flow.response.headers)) + len(flow.response.raw_content or b"")
            if self.past_budget(down):  # the request's bytes are counted already (request)
                host, port, intercepted = flow.metadata["wakeloop"]
                why = f"its answer's {down} bytes would pass this wake's {self.budget_text()} bytes"
                self.refuse(flow, host, port, flow.request.path, self.budget_text(), why, intercepted)
                return
        self.done(flow)

    def error(self, flow):
        self.done(flow)

    def done(self, flow):
        if "wakeloop" not in flow.metadata or flow.metadata.get("wakeloop_done"):
            return
        flow.metadata["wakeloop_done"] = True
        host, port, intercepted = flow.metadata["wakeloop"]
        up = len(bytes(flow.request.headers)) + len(flow.request.raw_content or b"")
        down = 0
        if flow.response is not None:
            down = len(bytes(flow.response.headers)) + len(flow.response.raw_content or b"")
            # An upstream that echoes the credential back does not show it to the box.
            for key, value in list(flow.response.headers.items()):
                if scrub(value) != value:
                    flow.response.headers[key] = scrub(value)
            content = flow.response.get_content(strict=False) or b""  # decoded: gzip hides nothing
            scrubbed = scrub(content.decode("latin-1")).encode("latin-1")
            if scrubbed != content:
                flow.response.set_content(scrubbed)  # re-encoded, Content-Length set anew
        self.spent += up + down - flow.metadata.get("wakeloop_spent", 0)
        rule = flow.metadata.get("wakeloop_rule", "")
        decision = "allow"
        self.record(
            host,
            port,
            flow.request.method,
            flow.request.path,
            decision,
            rule,
            intercepted,
            flow.metadata.get("wakeloop_credential", ""),
            up,
            down,
        )


addons = [Egress()]
