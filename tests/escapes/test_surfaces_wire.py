"""Every surface probe of escapes/surfaces/wire_probes.py can fail: each reports ESCAPED
against wakeloop with one of its checks switched off (monkeypatch). COVERED names
the probes shown able to fail here."""

from __future__ import annotations

import ssl

import pytest

from orchestrator.broker import tls
from orchestrator.escapes.surfaces import wire_probes as probes
from tests.helpers import must_escape

pytestmark = pytest.mark.docker

COVERED: set[str] = {"broker_tls_answers_only_the_orchestrator"}


def any_client(sock, context, timeout_s):
    """tls.accept without its check of whose certificate it is."""
    sock.settimeout(timeout_s)
    proven = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    proven.do_handshake()
    return proven


def test_the_tls_probe_escapes_a_broker_that_asks_no_client_certificate(surface_lab, monkeypatch):
    def lax(folder):
        context = tls.make_server_context(folder)  # a fresh one: the cached ones stay as they are
        context.verify_mode = ssl.CERT_NONE  # any client, certificate or not
        return context

    monkeypatch.setattr(tls, "server_context", lax)
    monkeypatch.setattr(tls, "accept", any_client)
    assert "TLS with no certificate" in must_escape(surface_lab, probes.broker_tls_answers_only_the_orchestrator)


def test_the_tls_probe_escapes_when_any_certificate_of_the_ca_may_be_a_client(surface_lab, monkeypatch):
    """Certificates made for any use (both usages on each), and no check of the client's name:
    the broker's own certificate, which every node holds, then serves as the orchestrator's."""
    monkeypatch.setattr(tls, "ROLES", {name: "serverAuth,clientAuth" for name in tls.ROLES})
    monkeypatch.setattr(tls, "accept", any_client)
    assert "the broker's own certificate" in must_escape(surface_lab, probes.broker_tls_answers_only_the_orchestrator)
