#!/bin/sh
# The orchestrator image's entrypoint: run as the owner of /agents, not root,
# where it can, so what the orchestrator writes in state/ belongs to the person
# who owns the agents folder on the host. A root-owned /agents (a clone made as
# root) keeps root, with only the capabilities compose leaves it.
#
# An agent folder from git has agent.yaml and mandate.md only (workspace/ and
# state/ are not committed): create them as `wakeloop init` would. Root hands
# the workspace to the sandbox's unprivileged user (uid 1000), as init does.
set -eu

AGENTS=/agents
SANDBOX_UID=1000

if [ "$(id -u)" = 0 ] && [ -d "$AGENTS" ] && [ "${WAKELOOP_KEEP_ROOT:-}" != 1 ]; then
    owner="$(stat -c %u "$AGENTS")"
    if [ "$owner" != 0 ]; then   # become the owner first: root here may not write their folders
        exec setpriv --reuid="$owner" --regid="$(stat -c %g "$AGENTS")" --clear-groups -- "$0" "$@"
    fi
fi

for dir in "$AGENTS"/*/; do
    [ -f "${dir}agent.yaml" ] || continue
    if [ ! -d "${dir}workspace" ]; then
        mkdir -p "${dir}workspace/memory/journal"
        printf '# Core memory\n\n(empty: this is the first wake)\n' > "${dir}workspace/memory/core.md"
        [ "$(id -u)" = 0 ] && chown -R "$SANDBOX_UID:$SANDBOX_UID" "${dir}workspace"
    fi
    [ -d "${dir}state" ] || mkdir -m 700 "${dir}state"
done
# Under a swarm the API key is a secret, a file (compose.yaml under `docker stack deploy`): read here, never
# in the service's environment, where `docker service inspect` would show it. "-": none.
if [ -n "${WAKELOOP_API_KEY_FILE:-}" ] && [ -z "${ANTHROPIC_API_KEY:-}" ] && [ -r "$WAKELOOP_API_KEY_FILE" ]; then
    key="$(cat "$WAKELOOP_API_KEY_FILE")"
    [ "$key" = - ] || export ANTHROPIC_API_KEY="$key"
fi
exec "$@"
