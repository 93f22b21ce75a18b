"""Weakened configs for the allowlist proxy, for tests only: each is the product's
`egress_plan.proxy_config` with some of its checks taken out. A test monkeypatches
`egress_plan.proxy_config` with one before a proxy is started; product code never
builds either."""

from __future__ import annotations

import json

from orchestrator.sandbox.egress import egress_plan

REAL_PROXY_CONFIG = egress_plan.proxy_config


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


def _without(check: str, name: str, doc: str):
    """The product's config with one of the addon's checks (a `check_*` key) off."""

    def weakened(egress, docker_subnets=()):
        conf = json.loads(REAL_PROXY_CONFIG(egress, docker_subnets))
        return json.dumps({**conf, check: False})

    weakened.__name__, weakened.__doc__ = name, doc
    return weakened


proxy_trusting_the_box_sni = _without(
    "check_sni", "proxy_trusting_the_box_sni", "The box's TLS name goes upstream; a request under any name is served."
)
proxy_ignoring_absolute_targets = _without(
    "check_authority", "proxy_ignoring_absolute_targets", "An absolute-form target in a tunnel is forwarded as sent."
)
proxy_taking_clear_text_for_tls = _without(
    "check_tls", "proxy_taking_clear_text_for_tls", "Whatever comes through a CONNECT to 443 counts as TLS."
)
proxy_matching_raw_paths = _without(
    "check_paths", "proxy_matching_raw_paths", "Rules match the path as sent: dot segments, encoded slashes and all."
)
proxy_recording_refusals_twice = _without(
    "record_once", "proxy_recording_refusals_twice", "A refusal's line, then an allow line when its 403 is sent."
)
proxy_cutting_nothing_in_flight = _without(
    "cut_at_budget",
    "proxy_cutting_nothing_in_flight",
    "The budget refuses the next request; a transfer runs to its end.",
)
