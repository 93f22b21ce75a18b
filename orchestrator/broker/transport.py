"""The broker's transport: how a request line reaches the Broker and its reply goes back.

A unix socket on one host (only ROOT's owner may connect), or TCP with mutual
TLS 1.3 between hosts (tls.py: the client proves it is the orchestrator before
it counts). Each connection is one thread that reads one request line (capped
at MAX_REQUEST_BYTES, whole within REQUEST_READ_S: a silent or dripping client
is cut off), hands its op (ops.parse) to Broker.serve and writes the typed
reply it gets back as one line (replies.to_json in wire.ok; `export` streams
frames before it, `import` reads frames after a first `ready` line: wire.py;
a frame left unread for STREAM_IDLE_S cuts the stream off); open
connections and TLS handshakes are capped, and a refusal is the wire's one
Refusal shape. `serve` is `wakeloop broker`: it removes what a crashed broker
left, listens, and on SIGTERM joins the calls in flight before it closes every
agent's box.

A second transport is a file like this one: it needs only `Broker.handle`.

Not here: what a request may do (server.py), the requests and replies (ops.py,
replies.py), the line format (wire.py), the certificates (tls.py).
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.broker import ops, replies, tls, wire
from orchestrator.broker.server import Broker, cut_to_line
from orchestrator.broker.wire import MAX_REQUEST_BYTES, BrokerError, Refusal
from orchestrator.policy.agent import AgentError
from orchestrator.policy.ceiling import Ceiling
from orchestrator.sandbox.box import SandboxError

MAX_CONNECTIONS = 128  # open connections; past it a new one is answered "busy" and closed
MAX_HANDSHAKES = 32  # TLS handshakes at once (each up to REQUEST_READ_S); past it closed at once
REFUSALS_LOG_S = 1.0  # a line about unproven peers at most this often
REQUEST_READ_S = 2.0  # the whole request line must arrive within this: a local client
# sends it at once; a silent or dripping one is cut off
REPLY_ERROR_CHARS = 2000  # a refusal sent back: one line, enough for a path and a reason


def _read_line(sock: socket.socket, limit: int, deadline_s: float) -> bytes:
    """One request line, refused past `limit` bytes or `deadline_s` seconds in all
    (not per read: a client dripping a byte a second is cut off too)."""
    deadline = time.monotonic() + deadline_s
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BrokerError(f"no complete request line within {deadline_s:g}s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(min(2**20, limit + 1 - size))
        except TimeoutError:
            raise BrokerError(f"no complete request line within {deadline_s:g}s") from None
        newline = chunk.find(b"\n")
        if newline >= 0:
            chunks.append(chunk[: newline + 1])
            return b"".join(chunks)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise BrokerError(f"request over {limit:,} bytes with no end of line")


class _Handler(socketserver.BaseRequestHandler):
    server: _Server | _TLSServer  # the one make_server made

    def handle(self) -> None:
        server = self.server
        if not self._proven(server):  # before it counts: a peer that cannot prove itself holds no slot
            return
        with server.connections_lock:
            server.open_connections += 1
            over = server.open_connections > MAX_CONNECTIONS
        try:
            self._serve(server.broker, over)
        finally:
            with server.connections_lock:
                server.open_connections -= 1

    def _proven(self, server: _Serving) -> bool:
        """Over TLS: the handshake, and the client proven the orchestrator (tls.py), or the
        connection closed with nothing sent. At most MAX_HANDSHAKES at once: past them a new
        connection is closed at once. Refusals are logged at most once per REFUSALS_LOG_S, with
        the count since. A unix socket: as it is."""
        if server.tls is None:
            return True
        with server.connections_lock:
            server.handshaking += 1
            crowded = server.handshaking > MAX_HANDSHAKES
        try:
            if crowded:
                raise ssl.SSLError(f"over {MAX_HANDSHAKES} handshakes at once")
            self.request = tls.accept(self.request, server.tls, REQUEST_READ_S)
        except (ssl.SSLError, OSError) as exc:
            _log_refusal(server, f"{self.client_address[0]}: {getattr(exc, 'reason', None) or exc}")
            return False
        finally:
            with server.connections_lock:
                server.handshaking -= 1
        return True

    def finish(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):  # the server closes the plain socket it accepted,
            self.request.close()  # which the TLS one took over

    def _serve(self, broker: Broker, over: bool) -> None:
        sock = self.request

        def answer() -> replies.Reply:
            if over:  # each connection is a thread: a flood of them is answered, not served
                raise BrokerError(f"busy: over {MAX_CONNECTIONS} connections open; try again shortly")
            match ops.parse(json.loads(_read_line(sock, MAX_REQUEST_BYTES, REQUEST_READ_S))):
                case ops.Export() as req:
                    return _export(broker, req, sock)
                case ops.Import() as req:
                    return _import(broker, req, sock)
                case req:
                    return broker.serve(req)

        reply = _reply(broker, answer)
        try:
            sock.settimeout(REQUEST_READ_S)  # a client that never reads cannot hold the thread
            sock.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass  # the client went away; the container is gone already


def _reply(broker: Broker, answer: Callable[[], replies.Reply]) -> wire.JSONObject:
    """`answer()`'s reply encoded, or the one Refusal shape for whatever it raised."""
    try:
        return wire.ok(replies.to_json(answer()))
    except (BrokerError, SandboxError) as exc:
        # "refused": the request or the agent's policy (exit 2 at the client); else the box failed (3).
        broker.log(f"{'refused' if isinstance(exc, BrokerError) else 'failed'}: {exc}")  # `docker compose logs`
        return wire.refusal(Refusal(cut_to_line(str(exc), REPLY_ERROR_CHARS), isinstance(exc, BrokerError)))
    except (ValueError, RecursionError):
        return wire.refusal(Refusal("a request is one JSON object on one line", True))
    except Exception as exc:  # one bad call must not stop the service
        return wire.refusal(
            Refusal(cut_to_line(f"broker error: {type(exc).__name__}: {exc}", REPLY_ERROR_CHARS), False)
        )


def _export(broker: Broker, req: ops.Export, sock: socket.socket) -> replies.Streamed:
    """Frames of the agent's workspace, the end frame; the reply line (sent by the caller) says
    what was sent: its sha256 and bytes on the wire, and the tree's digest (workspace_stream.py).
    Refused or broken off, the end frame still goes first: the client reads frames up to it, then
    the refusal's line."""
    sock.settimeout(wire.STREAM_IDLE_S)
    out = wire.FrameWriter(sock)
    try:
        summary = broker.export(req, out)
    except OSError as exc:  # the client went away, or the disk failed a read
        _end_frames(sock)
        raise SandboxError(f"{req.agent}: export broke off: {exc.strerror or exc}") from None
    except Exception:
        _end_frames(sock)
        raise
    out.end()
    return replies.Streamed(out.sha.hexdigest(), out.bytes, summary.digest, summary.entries)


def _import(broker: Broker, req: ops.Import, sock: socket.socket) -> replies.Streamed:
    """A first line (ready: the disk is made and empty), the client's frames into it; the reply
    line says what arrived (sha256, bytes) and what landed (the tree's digest). Refused after
    the first line, the rest of the stream is read first (capped as the stream is): a reply
    sent over frames still arriving would be lost in the reset of the close."""
    streams: list[wire.FrameReader] = []

    def receive(limit: int) -> wire.FrameReader:
        sock.settimeout(wire.STREAM_IDLE_S)
        sock.sendall(json.dumps(wire.ok(replies.to_json(replies.Ready()))).encode() + b"\n")
        streams.append(wire.FrameReader(sock.makefile("rb"), limit))
        return streams[0]

    try:
        summary = broker.import_(req, receive)
        streams[0].rest()  # tar's padding after its end, and the end frame: read, or the close resets
    except OSError as exc:
        _drain(streams)
        raise SandboxError(f"{req.agent}: import broke off: {exc.strerror or exc}") from None
    except Exception:
        _drain(streams)
        raise
    return replies.Streamed(streams[0].sha.hexdigest(), streams[0].bytes, summary.digest, summary.entries)


def _drain(streams: list[wire.FrameReader]) -> None:
    try:
        for stream in streams:
            stream.rest()
    except (OSError, BrokerError):
        pass


def _end_frames(sock: socket.socket) -> None:
    try:
        sock.settimeout(REQUEST_READ_S)
        wire.send_frame(sock, b"")
    except OSError:
        pass


def _log_refusal(server: _Serving, what: str) -> None:
    """One line per REFUSALS_LOG_S however many peers fail to prove themselves: the first, and a count."""
    with server.connections_lock:
        server.refused += 1
        now = time.monotonic()
        if now - server.refusal_logged < REFUSALS_LOG_S:
            return
        count, server.refused, server.refusal_logged = server.refused, 0, now
    server.broker.log(
        f"refused a connection from {what}" + (f" ({count} refused since the last such line)" if count > 1 else "")
    )


class _Serving(socketserver.ThreadingMixIn, socketserver.BaseServer):
    # On shutdown server_close() joins the request threads: a call in flight
    # finishes (its own deadline bounds it) and removes its container first.
    daemon_threads = False
    block_on_close = True
    request_queue_size = 128  # the listen backlog (socketserver's default is 5): a burst of
    # connections waits to be accepted instead of being refused
    open_connections = 0  # counted by _Handler, under connections_lock
    connections_lock: threading.Lock  # make_server's, one per server
    tls: ssl.SSLContext | None = None  # set: every connection proves itself first (tls.py)
    handshaking = 0  # TLS handshakes in progress, under connections_lock
    refused = 0  # connections refused since the last log line about them
    refusal_logged = float("-inf")  # when that line was
    broker: Broker  # set by make_server

    def service_actions(self) -> None:
        # Between polls of the serve loop; a rare close (two container removals)
        # only delays the next accept, and requests wait in the listen backlog.
        super().service_actions()
        self.broker.sweep()


class _Server(_Serving, socketserver.UnixStreamServer):
    pass


class _TLSServer(_Serving, socketserver.TCPServer):
    allow_reuse_address = True  # a restarted broker binds its port again at once


class _TLSServer6(_TLSServer):
    address_family = socket.AF_INET6


def make_server(broker: Broker, address: Path | str, tls_dir: Path | None = None) -> _Server | _TLSServer:
    """A server for `broker` listening on `address`: a unix socket's path, or tls://HOST:PORT
    with the broker's certificates in `tls_dir` (tls.py). The caller runs serve_forever,
    then shutdown and server_close (which joins the request threads)."""
    if str(address).startswith(tls.SCHEME):
        if tls_dir is None:
            raise tls.TLSConfigError(
                f"listening on {address} needs --tls-dir: the folder with {tls.CA} and {tls.BROKER_NAME}.pem/.key"
            )
        context = tls.server_context(Path(tls_dir).resolve())
        host, port = tls.host_port(str(address))
        server: _Server | _TLSServer = (_TLSServer6 if ":" in host else _TLSServer)((host, port), _Handler)
        server.tls = context
    else:
        server = _Server(str(address), _Handler)
    server.broker = broker
    server.connections_lock = threading.Lock()
    return server


def serve(
    root: Path,
    address: Path | str,
    ready: threading.Event | None = None,
    stop: threading.Event | None = None,
    ceiling: Ceiling | None = None,
    tls_dir: Path | None = None,
) -> int:
    """`wakeloop broker ROOT --socket PATH | --listen tls://HOST:PORT --tls-dir DIR [--ceiling FILE]`:
    serve until SIGTERM/SIGINT (or `stop`)."""
    import signal

    root = Path(root).resolve()
    if not root.is_dir():
        raise AgentError(f"{root} is not a folder; give the folder that holds the agents")
    broker = Broker(root, log=lambda line: print(f"broker: {line}", flush=True), ceiling=ceiling)
    left = broker.keeper.remove_leftovers()
    socket_path = None if str(address).startswith(tls.SCHEME) else Path(address)
    if socket_path is not None:
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        if socket_path.is_socket():
            socket_path.unlink()  # a stale socket from a broker that died
    server = make_server(broker, socket_path or address, tls_dir)
    if socket_path is not None:
        _hand_socket_to_root_owner(socket_path, root)
    bound = f"tls://{tls.host_port(str(address))[0]}:{server.socket.getsockname()[1]}" if socket_path is None else ""
    where = socket_path or f"{bound} (mutual TLS: clients of {tls.ORCHESTRATOR_NAME}'s certificate only)"
    print(
        f"broker: serving run/write/append for agents under {root} (host path {broker.keeper.host_root}) "
        f"on {where}, {f'ceiling {ceiling.source}' if ceiling else 'no ceiling'}"
        f"{f'; removed {left} leftover container(s)' if left else ''}",
        flush=True,
    )

    def halt(*_: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, halt)
        signal.signal(signal.SIGINT, halt)
    if stop is not None:
        stopped = stop

        def halt_when_stopped() -> None:
            stopped.wait()
            halt()

        threading.Thread(target=halt_when_stopped, daemon=True).start()
    if ready is not None:
        ready.set()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        broker.close()  # after the last request: every agent's idle pool containers go
        if socket_path is not None:
            socket_path.unlink(missing_ok=True)
        left = broker.keeper.remove_leftovers()
    print(f"broker: stopped{f'; removed {left} leftover container(s)' if left else ''}", flush=True)
    return 0


def _hand_socket_to_root_owner(socket_path: Path, root: Path) -> None:
    """Only the owner of the agents folder (who the orchestrator runs as) may connect."""
    st = root.stat()
    if os.geteuid() == 0:
        os.chown(socket_path, st.st_uid, st.st_gid)
    os.chmod(socket_path, 0o660)
