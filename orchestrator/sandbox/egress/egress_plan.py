"""The allowlist's plan: what a policy lets one agent's box reach, as data; pure functions
of the policy (and, for the operator's two test settings and the credentials' values, of the
environment of the process that makes the proxies). Nothing here talks to the engine.

`plan` names an agent's network, holder and proxy (keyed by its workspace and every setting
the proxy's config holds); `plan_for` makes that from a sandbox policy; `grant_refusal` and
`granted` say which hosts a person's approval may add to one call, and the plan that call
gets; `proxy_config` is the proxy's config (proxy-image/egress_addon.py reads it: the list,
the destinations refused, NON_PUBLIC among them, the intercepted hosts with their credentials'
templates and rules, the budget); `secret_env` the credentials' values, for the proxy's
environment only; `Egress.env` what the box's environment gets (the proxy, the CA's
variables, the credentials' placeholders).

Not here: running the proxy, its network and holder, its log and the wake's decisions
(network.py, whose docstring tells what the proxy does with this config), whether a policy
may use the network (policy/load.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from orchestrator.errors import EnvironmentFault
from orchestrator.policy.load import parse_host
from orchestrator.policy.schema import Credential, HttpRule, SandboxPolicy, host_glob
from orchestrator.sandbox.containers.programs import CA_FILE

PROXY_ALIAS = "wakeloop-proxy"  # the proxy's name on each internal network
PROXY_PORT = 3128  # the port squid used to listen on; kept, tools and docs know it
CA_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS")
SECRET_PREFIX = "WAKELOOP_SECRET_"  # a credential's value, in the proxy's environment only
# Destinations that are not the public internet, by the address a name resolves to.
# The addon also refuses whatever Python's ipaddress does not call global; these stay
# listed so that the record of what is refused does not hang on one library's table.
# The proxy's own Docker networks are added when its config is written (network.py's docker_subnets).
NON_PUBLIC = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # RFC 1918
    "100.64.0.0/10",  # carrier-grade NAT
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local, the cloud metadata address
    "172.16.0.0/12",  # RFC 1918 (Docker's default pools)
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # documentation
    "192.168.0.0/16",  # RFC 1918
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation
    "203.0.113.0/24",  # documentation
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, broadcast
    "::/128",
    "::1/128",  # unspecified, loopback
    "100::/64",  # discard
    "2001:db8::/32",  # documentation
    "fc00::/7",  # unique-local
    "fe80::/10",  # link-local
    "fec0::/10",  # site-local (deprecated)
    "ff00::/8",  # multicast
)


DEFAULT_BUDGET = SandboxPolicy().max_egress_bytes_per_wake


class NetworkError(EnvironmentFault):
    """The allowlist could not be set up: one line for the human."""


@dataclass(frozen=True)
class Egress:
    """The names and settings of one agent's allowlist plumbing; `plan` makes it, `ensure` builds it.
    `private_ok` and `upstream_ca` are for tests of our own only (no policy key sets them):
    names the proxy may connect to at a private address, and a CA it trusts upstream besides Debian's."""

    key: str
    allow_hosts: tuple[str, ...]
    credentials: tuple[Credential, ...] = ()
    http: tuple[HttpRule, ...] = ()
    budget: int = DEFAULT_BUDGET  # bytes per wake through the proxy; 0: no cap
    ask: tuple[str, ...] = ()  # approve.rules' network_host globs: an unlisted host they cover asks a person
    private_ok: tuple[str, ...] = ()
    upstream_ca: str = ""

    @property
    def internal_network(self) -> str:
        return f"wakeloop-allow-{self.key}"

    @property
    def holder(self) -> str:
        return f"wakeloop-netns-{self.key}"

    @property
    def proxy(self) -> str:
        return f"wakeloop-proxy-{self.key}"

    @property
    def network_mode(self) -> str:
        return f"container:{self.holder}"

    @property
    def proxy_url(self) -> str:
        return f"http://{PROXY_ALIAS}:{PROXY_PORT}"

    @property
    def intercepted(self) -> tuple[str, ...]:
        """The hosts whose HTTPS the proxy opens: those with a credential or rules."""
        return tuple(dict.fromkeys([*(c.host for c in self.credentials), *(r.host for r in self.http)]))

    def placeholder(self, cred: Credential) -> str:
        """What the box holds in place of a credential: unique to this agent, worthless elsewhere."""
        digest = hashlib.sha256(f"{self.key}\n{cred.host}\n{cred.var}".encode()).hexdigest()[:24]
        return f"wakeloop-placeholder-{cred.placeholder_env}-{digest}"

    def env(self) -> dict[str, str]:
        """What the sandbox gets; both cases, since tools disagree on which they read.
        With an intercepted host, the CA variables and the credentials' placeholders too."""
        url = self.proxy_url
        env = {
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "NO_PROXY": "localhost,127.0.0.1",
            "no_proxy": "localhost,127.0.0.1",
        }
        if self.intercepted:
            env |= {name: CA_FILE for name in CA_VARS}
        env |= {c.placeholder_env: self.placeholder(c) for c in self.credentials if c.placeholder_env}
        return env


def plan(
    workspace: Path,
    allow_hosts: tuple[str, ...],
    credentials: tuple[Credential, ...] = (),
    http: tuple[HttpRule, ...] = (),
    budget: int = DEFAULT_BUDGET,
    private_ok: tuple[str, ...] = (),
    upstream_ca: str = "",
    ask: tuple[str, ...] = (),
) -> Egress:
    """Pure: the names for this agent and list. One set per agent (keyed by its
    workspace), so one agent's sandbox never shares a network with another's.
    The key covers every setting the proxy's config holds (a changed one is a new
    proxy); a plain list keys as it always did."""
    extra = [
        credentials,
        http,
        budget if budget != DEFAULT_BUDGET else 0,
        private_ok,
        upstream_ca,
        *([ask] if ask else []),
    ]
    text = f"{Path(workspace).resolve()}\n{sorted(allow_hosts)}" + (f"\n{extra!r}" if any(extra) else "")
    digest = hashlib.sha256(text.encode())
    return Egress(
        key=digest.hexdigest()[:12],
        allow_hosts=tuple(allow_hosts),
        credentials=tuple(credentials),
        http=tuple(http),
        budget=budget,
        ask=tuple(ask),
        private_ok=tuple(private_ok),
        upstream_ca=upstream_ca,
    )


PRIVATE_OK_ENV = "WAKELOOP_EGRESS_PRIVATE_OK"  # names (comma-separated) the proxy may reach at private addresses
UPSTREAM_CA_ENV = "WAKELOOP_EGRESS_UPSTREAM_CA"  # a PEM file the proxy trusts upstream besides Debian's store


def plan_for(workspace: Path, policy: SandboxPolicy, environ: Mapping[str, str] = os.environ) -> Egress:
    """The plan for a sandbox policy with `network: allowlist`. Two settings are the
    operator's, never a policy's: read from the environment of the process that makes
    the proxies (the broker under compose, whose environment compose.override.yaml sets, as it
    sets its ceiling), off when unset. Tests of our own use them to name their own
    HTTPS server, which sits at a private address like every container."""
    private_ok = tuple(n.strip().lower() for n in environ.get(PRIVATE_OK_ENV, "").split(",") if n.strip())
    ca_path = environ.get(UPSTREAM_CA_ENV, "")
    try:
        upstream_ca = Path(ca_path).read_text(encoding="ascii") if ca_path else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise NetworkError(f"{UPSTREAM_CA_ENV}: cannot read {ca_path}: {exc}") from None
    return plan(
        workspace,
        policy.allow_hosts,
        policy.credentials,
        policy.http,
        policy.max_egress_bytes_per_wake,
        private_ok,
        upstream_ca,
        policy.ask_hosts,
    )


MAX_GRANT = 16  # hosts one approved call may be granted


def grant_refusal(policy: SandboxPolicy, hosts: tuple[str, ...]) -> str:
    """Why `hosts` may not be granted to an approved call under `policy`, or "": each must be a
    host name (port optional), no wildcard, no IP address, that a network_host glob covers; and
    the policy's network an allowlist (the tools, the engine and the broker all ask this one)."""
    if policy.network != "allowlist":
        return f"network is {policy.network}, not allowlist"
    if len(hosts) > MAX_GRANT:
        return f"{len(hosts)} hosts; at most {MAX_GRANT}"
    for entry in hosts:
        try:
            wildcard, host, _ = parse_host(entry)
        except ValueError as exc:
            return f"{entry!r:.80}: {exc}"
        if wildcard or entry != entry.lower():
            return f"{entry!r:.80}: name one host, lower-case, not a wildcard"
        if host_glob(policy.ask_hosts, host) is None:
            return f"{host} is not covered by any approve.rules network_host of this agent's policy"
    return ""


def granted(egress: Egress, workspace: Path, hosts: tuple[str, ...]) -> Egress:
    """The plan for one approved call (records/approvals.py): the agent's list and `hosts`, and
    nothing asked. Its key differs from the agent's, so the call gets a proxy, network and holder
    of its own, removed after it (engine.py's _granted_run): the grant outlives no call."""
    return plan(
        workspace,
        tuple(dict.fromkeys([*egress.allow_hosts, *hosts])),
        egress.credentials,
        egress.http,
        egress.budget,
        egress.private_ok,
        egress.upstream_ca,
    )


# -- the proxy's config ----------------------------------------------------------------


class _Intercepted(TypedDict):
    """One intercepted host in the proxy's config (proxy-image/egress_addon.py reads it)."""

    credentials: list[dict[str, str]]  # header, value (a template), var, placeholder_env, placeholder
    allow: list[str] | None  # sandbox.http's rules for the host; None: every request
    where: str  # the first rule's file:line


def proxy_config(egress: Egress, docker_subnets: tuple[str, ...] = ()) -> str:
    """The addon's config (proxy-image/egress_addon.py), as JSON: the list (validated by
    policy/load.py's parse_host), the destinations refused (NON_PUBLIC, `docker_subnets`:
    the proxy's own networks, whatever address pool the engine uses), the intercepted
    hosts with their credentials (templates, never values) and rules, the budget."""
    intercept: dict[str, _Intercepted] = {
        h: {"credentials": [], "allow": None, "where": ""} for h in egress.intercepted
    }
    for cred in egress.credentials:
        intercept[cred.host]["credentials"].append(
            {
                "header": cred.header,
                "value": cred.value,
                "var": cred.var,
                "placeholder_env": cred.placeholder_env,
                "placeholder": egress.placeholder(cred) if cred.placeholder_env else "",
            }
        )
    for rule in egress.http:
        entry = intercept[rule.host]
        entry["allow"] = [*(entry["allow"] or []), *rule.allow]
        entry["where"] = entry["where"] or rule.source
    conf = {
        "allow": [list(parse_host(entry)) for entry in egress.allow_hosts],
        "blocked": [*NON_PUBLIC, *docker_subnets],
        "check_addresses": True,
        "private_ok": list(egress.private_ok),
        "intercept": intercept,
        "budget": egress.budget,
        "ask": list(egress.ask),
    }
    return json.dumps(conf, sort_keys=True)


def secret_env(egress: Egress, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The credentials' values, for the proxy's environment only, from `environ`
    (the process that makes the proxies). A variable that is not set is a NetworkError."""
    out = {}
    for cred in egress.credentials:
        value = environ.get(cred.var, "")
        if not value:
            raise NetworkError(
                f"sandbox.credentials names {cred.var} for {cred.host}, which is not set where the proxy "
                "is made (the broker's environment under compose)"
            )
        out[SECRET_PREFIX + cred.var] = value
    return out
