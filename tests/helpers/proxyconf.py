"""Weakened configs for the allowlist proxy, for tests only: each is the product's
`network.proxy_config` with some of its checks taken out. A test monkeypatches
`network.proxy_config` with one before a proxy is started; product code never
builds either."""

from __future__ import annotations

import json

from orchestrator.sandbox import network

REAL_PROXY_CONFIG = network.proxy_config


def proxy_without_address_rules(egress, docker_subnets=()):
    """Names only: the list is kept, the checks on resolved addresses are gone."""
    conf = json.loads(REAL_PROXY_CONFIG(egress, docker_subnets))
    return json.dumps({**conf, "check_addresses": False, "blocked": []})


def proxy_allowing_everything(egress, docker_subnets=()):
    """Any name, any port, any address."""
    conf = json.loads(REAL_PROXY_CONFIG(egress, docker_subnets))
    return json.dumps({**conf, "allow": [[False, "*", None]], "check_addresses": False, "blocked": []})


def proxy_with_credentials_everywhere(egress, docker_subnets=()):
    """Every intercepted host gets every credential (and honours every placeholder)."""
    conf = json.loads(REAL_PROXY_CONFIG(egress, docker_subnets))
    everyone = [c for spec in conf["intercept"].values() for c in spec["credentials"]]
    for spec in conf["intercept"].values():
        spec["credentials"] = everyone
    return json.dumps(conf)


def ca_with_its_key(proxy) -> str:
    """What the box would get if the proxy handed over its CA's key with the certificate."""
    return proxy.exec_run(["cat", "/tmp/mitm/mitmproxy-ca.pem"], user="proxy").output.decode()
