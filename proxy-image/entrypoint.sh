#!/bin/sh
# The egress proxy: mitmdump with our one addon. Its CA (made here, at start, in
# /tmp, a tmpfs of this container only) signs the certificates of intercepted
# hosts; its key never leaves this container. Upstream certificates are checked
# against Debian's store, plus a test's own CA when network.py passes one.
# An intercepted request or response is held whole to be ruled and counted: one
# over 32 MB is refused, so a few at once stay within the container's 256 MB.
set -eu
[ -n "${WAKELOOP_EGRESS_CONF:-}" ] || { echo "wakeloop-proxy: WAKELOOP_EGRESS_CONF is empty" >&2; exit 2; }
umask 077
mkdir -p /tmp/mitm
cat /etc/ssl/certs/ca-certificates.crt > /tmp/upstream-ca.pem
printf '%s\n' "${WAKELOOP_UPSTREAM_CA:-}" >> /tmp/upstream-ca.pem
unset WAKELOOP_UPSTREAM_CA
exec mitmdump --listen-port 3128 --set confdir=/tmp/mitm \
  --set ssl_verify_upstream_trusted_ca=/tmp/upstream-ca.pem \
  --set termlog_verbosity=warn --set flow_detail=0 --set connection_strategy=eager \
  --set body_size_limit=32m \
  -s /usr/local/lib/wakeloop/egress_addon.py
