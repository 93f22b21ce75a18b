#!/usr/bin/env bash
# Make gVisor's runsc available to the Docker engine as the runtime `runsc`.
#
# 1. install runsc from Debian's packages if it is missing or too old;
# 2. register it in /etc/docker/daemon.json under "runtimes" with
#    runtimeArgs ["--network=none"] (gVisor's own netstack off: a runsc
#    sandbox has no network at all, whatever the policy's `network` says)
#    and "--oci-seccomp" (the engine's seccomp profile and wakeloop's own
#    filter are then enforced inside gVisor too, as defence in depth),
#    merged into whatever the file already holds, never overwriting it;
# 3. only if the file changed, make dockerd re-read it: SIGHUP reloads
#    "runtimes" without a restart, which works the same for a systemd
#    service and for a dockerd started by hand in the background.
#
# Idempotent; safe to run before every test run. Needs root.
set -euo pipefail

DAEMON_JSON="${DAEMON_JSON:-/etc/docker/daemon.json}"
RUNTIME="${RUNTIME:-runsc}"
WAIT_S=30   # how long dockerd gets to show the runtime after a reload

# runsc releases before this one answer statx(2) with flags coreutils passes
# (AT_NO_AUTOMOUNT) with EINVAL, so `ls -la` and `stat` fail in the box.
MIN_RELEASE=20240729
release() { runsc --version 2>/dev/null | grep -o '20[0-9]\{6\}' | head -1; }

if ! command -v runsc >/dev/null || [ "$(release)" -lt "$MIN_RELEASE" ]; then
    # Debian 12 ships runsc 20221219; its backports carry 20240729. Later
    # releases (13 and on) carry a recent enough one in main.
    suite=""
    if grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
        suite=bookworm-backports
        echo "deb http://deb.debian.org/debian bookworm-backports main" \
            > /etc/apt/sources.list.d/wakeloop-bookworm-backports.list
    fi
    echo "runsc: installing the Debian package${suite:+ from $suite} (want release >= $MIN_RELEASE)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ${suite:+-t "$suite"} runsc >/dev/null
    [ "$(release)" -ge "$MIN_RELEASE" ] || { echo "runsc: release $(release) is older than $MIN_RELEASE"; exit 1; }
fi
RUNSC="$(command -v runsc)"

mkdir -p "$(dirname "$DAEMON_JSON")"
changed="$(python3 - "$DAEMON_JSON" "$RUNTIME" "$RUNSC" <<'PY'
import json, os, sys
path, name, binary = sys.argv[1:]
try:
    with open(path) as f:
        text = f.read()
    config = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    config = {}
want = {"path": binary, "runtimeArgs": ["--network=none", "--oci-seccomp"]}
runtimes = config.setdefault("runtimes", {})
if runtimes.get(name) == want:
    print("no")
    sys.exit(0)
runtimes[name] = want
tmp = path + ".wakeloop.tmp"
with open(tmp, "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
print("yes")
PY
)"

has_runtime() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q "\"$RUNTIME\""; }

if [ "$changed" = yes ] || ! has_runtime; then
    echo "runsc: registered in $DAEMON_JSON; reloading dockerd"
    if command -v systemctl >/dev/null && systemctl is-active --quiet docker 2>/dev/null; then
        systemctl reload docker
    else
        pid="$(pgrep -o -x dockerd || true)"
        [ -n "$pid" ] || { echo "runsc: dockerd is not running; start it, then run this again"; exit 1; }
        kill -HUP "$pid"
    fi
    for _ in $(seq "$WAIT_S"); do
        has_runtime && break
        sleep 1
    done
    has_runtime || { echo "runsc: dockerd did not pick up the runtime; restart dockerd"; exit 1; }
fi
echo "runsc: available as runtime '$RUNTIME' ($("$RUNSC" --version 2>/dev/null | head -1))"
