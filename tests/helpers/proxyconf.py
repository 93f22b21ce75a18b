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
