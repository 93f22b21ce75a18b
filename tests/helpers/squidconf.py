"""Weakened squid.conf for the allowlist proxy, for tests only: each is the
product's `network.squid_config` with some of its rules taken out. A test
monkeypatches `network.squid_config` with one before a proxy is started;
product code never builds either."""

from __future__ import annotations

from orchestrator.sandbox import network

REAL_SQUID_CONFIG = network.squid_config
ADDRESS_RULES = ("http_access deny to_nonpublic", "http_access deny to_docker", "http_access deny to_localhost")


def squid_without_address_rules(allow_hosts, docker_subnets=()):
    """Names only: the list is kept, the rules on resolved addresses are gone."""
    conf = REAL_SQUID_CONFIG(allow_hosts, docker_subnets)
    return "".join(line + "\n" for line in conf.splitlines() if line not in ADDRESS_RULES)


def squid_allowing_everything(allow_hosts, docker_subnets=()):
    """Every http_access rule replaced by `allow all`."""
    conf = REAL_SQUID_CONFIG(allow_hosts, docker_subnets)
    return (
        "".join(line + "\n" for line in conf.splitlines() if not line.startswith("http_access"))
        + "http_access allow all\n"
    )
