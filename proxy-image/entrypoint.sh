#!/bin/sh
# Write the generated config where the read-only root allows (/tmp is a
# tmpfs), check it, then run squid in the foreground.
set -eu
[ -n "${WAKELOOP_SQUID_CONF:-}" ] || { echo "wakeloop-proxy: WAKELOOP_SQUID_CONF is empty" >&2; exit 2; }
printf '%s\n' "$WAKELOOP_SQUID_CONF" > /tmp/squid.conf
squid -k parse -f /tmp/squid.conf 2>/tmp/parse.log || { cat /tmp/parse.log >&2; exit 2; }
exec squid -N -f /tmp/squid.conf
