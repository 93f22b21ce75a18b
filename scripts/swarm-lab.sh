#!/usr/bin/env bash
# A three-node Docker Swarm on this one machine, apart from its own engine:
#   scripts/swarm-lab.sh up     # build it (idempotent), load the images, print how to reach each engine
#   scripts/swarm-lab.sh down   # remove everything `up` made, whatever state it is in
#   scripts/swarm-lab.sh env N  # `export DOCKER_HOST=...` for node N (eval "$(scripts/swarm-lab.sh env 1)")
#   scripts/swarm-lab.sh stop N / start N   # node N's engine stopped (a node lost) / started again
#
# Each node is a dockerd (and the containerd it starts) in a network namespace
# of its own (swx-n1..3, 10.211.0.11-13/24 on a bridge in namespace swx-br,
# which also holds 10.211.0.1 for reaching the nodes: `ip netns exec swx-br ...`)
# and a private mount tree: a fresh sysfs with the host's cgroups bound back,
# a tmpfs over /run (its /var/run/docker.sock is its own), its own /etc/docker (else the nodes
# share one identity), its own hostname, data root, exec root, pidfile, socket
# and cgroup parent (swx-nN). All three are raft managers, so a swarm of two
# keeps its quorum when one node's engine is stopped. How it was found, and what
# this kernel cannot do (no IPVS: dnsrr only; no routing mesh: host-mode ports;
# no ESP: no encrypted overlay): ../shared/notes/swarm-lab.md, docs/scale-out.md.
#
# A node's private mount tree starts as a copy of every mount the host has then,
# agents' workspace disks included: each would be held open by the node (its
# loop device undetachable, `wakeloop disk release` and every escape trial
# failing with "still open") until the lab went down. So right after unshare,
# before dockerd starts, the node lets go of its copy of every loop device's
# mount, of anything under the disks' folders, and of any overlay on a loop
# device (a wake's), lazily: the lab holds nothing of the host's.
#
# Environment: WAKELOOP_SWARM_LAB (the lab's folder, a tmpfs: /var/tmp/wakeloop-swarm-lab),
# WAKELOOP_SWARM_IMAGES (the images loaded into every node: wakeloop:latest
# wakeloop-sandbox:latest), WAKELOOP_DISKS (the host's disks' folder, besides
# /var/lib/wakeloop/disks). Needs root, iproute2, util-linux, dockerd, awk.
set -euo pipefail

LAB=${WAKELOOP_SWARM_LAB:-/var/tmp/wakeloop-swarm-lab}
IMAGES=${WAKELOOP_SWARM_IMAGES:-wakeloop:latest wakeloop-sandbox:latest}
NODES=(1 2 3)
BRIDGE_NS=swx-br
SUBNET=10.211.0
ADDR_POOL=10.212.0.0/16  # overlay subnets, away from the nodes' own and the host's 10.0.0.0/8 users
START_S=60
SIZE=${WAKELOOP_SWARM_LAB_SIZE:-6g}  # the tmpfs; about 2 GiB used with the two images in three nodes
STOP_S=10  # SIGTERM to SIGKILL: three managers stopping at once can wait on each other
HOST_DISKS="/var/lib/wakeloop/disks${WAKELOOP_DISKS:+:$WAKELOOP_DISKS}"  # folders of the host's disks, : between

# The mount points a node's copy of the host's mounts must let go of, read from a
# mountinfo given twice (first pass: where loop devices are mounted): every mount of a
# loop device, anything at or under one of `disks` (: between), and every overlay with a
# layer on a loop device's mount (a wake's). Never /. Octal escapes (\040) decoded.
# shellcheck disable=SC2016  # an awk program: its $ are awk's
HOST_MOUNTS_AWK='
function path(p) { gsub(/\\040/, " ", p); gsub(/\\011/, "\t", p); gsub(/\\012/, "\n", p); gsub(/\\134/, "\\", p); return p }
function under(p, d) { return d != "" && (p == d || index(p, d "/") == 1) }
{ for (i = 7; $i != "-"; i++) {}; kind = $(i + 1); source = $(i + 2); options = $(i + 3) }
NR == FNR { if (source ~ /^\/dev\/loop/) loops[$5] = 1; next }
$5 == "/" { next }
source ~ /^\/dev\/loop/ { print path($5); next }
{ n = split(disks, dirs, ":"); for (j = 1; j <= n; j++) if (under(path($5), dirs[j])) { print path($5); next } }
kind == "overlay" { for (t in loops) if (index(options, "=" t "/") || index(options, ":" t "/")) { print path($5); next } }
'

node_ns() { echo "swx-n$1"; }
node_ip() { echo "$SUBNET.1$1"; }
node_dir() { echo "$LAB/n$1"; }
node_sock() { echo "$(node_dir "$1")/docker.sock"; }
dk() { local n=$1; shift; docker -H "unix://$(node_sock "$n")" "$@"; }
say() { echo "swarm-lab: $*" >&2; }

netns_exists() { [ -e "/run/netns/$1" ]; }

make_network() {
    netns_exists "$BRIDGE_NS" || ip netns add "$BRIDGE_NS"
    ip -n "$BRIDGE_NS" link show br0 >/dev/null 2>&1 || ip -n "$BRIDGE_NS" link add br0 type bridge
    ip -n "$BRIDGE_NS" addr replace "$SUBNET.1/24" dev br0
    ip -n "$BRIDGE_NS" link set lo up
    ip -n "$BRIDGE_NS" link set br0 up
    for n in "${NODES[@]}"; do
        local ns
        ns=$(node_ns "$n")
        netns_exists "$ns" || ip netns add "$ns"
        if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
            ip -n "$BRIDGE_NS" link del "veth$n" 2>/dev/null || true
            ip link add "swx-v$n" type veth peer name "swx-p$n"
            ip link set "swx-v$n" netns "$ns"
            ip link set "swx-p$n" netns "$BRIDGE_NS"
            ip -n "$ns" link set "swx-v$n" name eth0
            ip -n "$BRIDGE_NS" link set "swx-p$n" name "veth$n"
        fi
        ip -n "$BRIDGE_NS" link set "veth$n" master br0 up
        ip -n "$ns" addr replace "$(node_ip "$n")/24" dev eth0
        ip -n "$ns" link set lo up
        ip -n "$ns" link set eth0 up
    done
}

engine_answers() { dk "$1" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

start_engine() {
    local n=$1 dir
    dir=$(node_dir "$n")
    if engine_answers "$n"; then return; fi
    mkdir -p "$dir/data" "$dir/exec" "$dir/etc" "$dir/cgroup"
    [ -f /etc/docker/daemon.json ] && cp /etc/docker/daemon.json "$dir/etc/daemon.json"  # runsc, as the host
    # Inside: a private mount tree, without its copy of the host's disks (HOST_MOUNTS_AWK;
    # what went is listed in host-mounts-dropped); the host's cgroup tree moved onto a fresh
    # sysfs (which shows this namespace's network devices); a tmpfs over /run, so
    # neither dockerd nor containerd finds the host's sockets, and a service that
    # mounts /var/run/docker.sock (the broker) gets its own node's engine there.
    nsenter --net="/run/netns/$(node_ns "$n")" unshare -m -u setsid sh -c '
        set -e
        mount --make-rprivate /
        : >"$0/host-mounts-dropped"
        for _ in 1 2 3 4; do  # again: of two stacked mounts (a wake overlay on a disk bind), umount takes the top
            awk -v disks="$3" "$2" /proc/self/mountinfo /proc/self/mountinfo | sort -r >"$0/dropping"
            [ -s "$0/dropping" ] || break
            while IFS= read -r target; do umount -l "$target" 2>/dev/null || true; done <"$0/dropping"
            cat "$0/dropping" >>"$0/host-mounts-dropped"
        done
        rm -f "$0/dropping"
        mount --rbind /sys/fs/cgroup "$0/cgroup"
        mount -t sysfs sysfs /sys
        mount --move "$0/cgroup" /sys/fs/cgroup
        mount -t tmpfs tmpfs /run
        mount --bind "$0/etc" /etc/docker
        hostname "swx-n$1"
        export DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1
        exec dockerd --data-root "$0/data" --exec-root "$0/exec" --pidfile "$0/dockerd.pid" \
            -H "unix://$0/docker.sock" -H unix:///run/docker.sock --cgroup-parent "swx-n$1" >"$0/dockerd.log" 2>&1
    ' "$dir" "$n" "$HOST_MOUNTS_AWK" "$HOST_DISKS" </dev/null >/dev/null 2>&1 &
    local waited=0
    until engine_answers "$n"; do
        sleep 0.2
        waited=$((waited + 1))
        if [ "$waited" -gt $((START_S * 5)) ]; then
            say "node $n's engine did not answer in ${START_S}s; its log: $dir/dockerd.log"
            tail -5 "$dir/dockerd.log" >&2 || true
            return 1
        fi
    done
}

swarm_state() { dk "$1" info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null || echo unknown; }

form_swarm() {
    if [ "$(swarm_state 1)" != active ]; then
        dk 1 swarm init --advertise-addr "$(node_ip 1)" --listen-addr "$(node_ip 1):2377" \
            --default-addr-pool "$ADDR_POOL" >/dev/null
    fi
    local token
    token=$(dk 1 swarm join-token -q manager)
    for n in "${NODES[@]:1}"; do
        if [ "$(swarm_state "$n")" != active ]; then
            dk "$n" swarm join --token "$token" --advertise-addr "$(node_ip "$n")" \
                --listen-addr "$(node_ip "$n"):2377" "$(node_ip 1):2377" >/dev/null
        fi
    done
}

load_images() {
    local tar="$LAB/images.tar" missing=()
    for n in "${NODES[@]}"; do
        for image in $IMAGES; do
            [ "$(docker image inspect --format '{{.Id}}' "$image")" = \
                "$(dk "$n" image inspect --format '{{.Id}}' "$image" 2>/dev/null)" ] || missing+=("$n")
        done
    done
    [ "${#missing[@]}" -eq 0 ] && return
    # shellcheck disable=SC2086  # IMAGES is a list of names
    docker save -o "$tar" $IMAGES
    local pids=()
    for n in $(printf '%s\n' "${missing[@]}" | sort -u); do dk "$n" load -q -i "$tar" >/dev/null & pids+=($!); done
    for pid in "${pids[@]}"; do wait "$pid"; done
    rm -f "$tar"
}

# The lab's engines keep their data on a tmpfs: removing three data roots of
# extracted images from this machine's disk took 74 s; a tmpfs goes in one umount.
make_folder() {
    mkdir -p "$LAB"
    mountpoint -q "$LAB" || mount -t tmpfs -o "size=$SIZE,mode=0755" wakeloop-swarm-lab "$LAB"
}

up() {
    make_folder
    make_network
    for n in "${NODES[@]}"; do start_engine "$n"; done
    form_swarm
    load_images
    dk 1 node ls >&2
    for n in "${NODES[@]}"; do
        echo "node $n ($(node_ip "$n"), netns $(node_ns "$n")): DOCKER_HOST=unix://$(node_sock "$n")"
    done
}

stop_engine() {
    local n=$1 pid
    pid=$(cat "$(node_dir "$n")/dockerd.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 1 "$((STOP_S * 10))"); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    # What is left in the node's network namespace (a dockerd past STOP_S, its
    # containerd and shims): a lab's engine keeps nothing worth a longer wait.
    netns_exists "$(node_ns "$n")" && ip netns pids "$(node_ns "$n")" | xargs -r kill -KILL 2>/dev/null
    return 0
}

# What a killed engine left in its cgroup folders (shims, containers), then the folders.
remove_cgroups() {
    local n=$1 folder
    for folder in /sys/fs/cgroup/*/"swx-n$n" /sys/fs/cgroup/unified/"swx-n$n"; do
        [ -d "$folder" ] || continue
        find "$folder" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
        find "$folder" -depth -type d -exec rmdir {} + 2>/dev/null || true
        [ ! -d "$folder" ] || { sleep 0.5; find "$folder" -depth -type d -exec rmdir {} + 2>/dev/null || true; }
        [ ! -d "$folder" ] || say "left $folder (still has processes?)"
    done
}

# The loop devices of the brokers' workspace disks (the kernel's, not a node's), when a broker
# went with its engine before it let them go: those whose file is on the lab's tmpfs only.
detach_loops() {
    mountpoint -q "$LAB" || return 0
    local fs dev back
    fs=$(mountpoint -d "$LAB")
    losetup -n -l -O NAME,BACK-MAJ:MIN | while read -r dev back; do
        if [ "$back" = "$fs" ]; then losetup -d "$dev" || true; fi
    done
}

down() {
    for n in "${NODES[@]}"; do stop_engine "$n" & done
    wait
    for n in "${NODES[@]}"; do  # the processes are gone only once the namespace has none
        for _ in $(seq 1 50); do [ -z "$(ip netns pids "$(node_ns "$n")" 2>/dev/null)" ] && break; sleep 0.1; done
    done
    for n in "${NODES[@]}"; do
        remove_cgroups "$n"
        netns_exists "$(node_ns "$n")" && ip netns del "$(node_ns "$n")"
    done
    netns_exists "$BRIDGE_NS" && ip netns del "$BRIDGE_NS"
    detach_loops
    # Mounts dockerd made under the lab live in the nodes' private mount trees and
    # went with them; anything left in the host's tree (a crash mid-`up`) goes here.
    grep -o " $LAB/[^ ]*" /proc/self/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    if mountpoint -q "$LAB"; then umount "$LAB" || umount -l "$LAB"; fi
    rm -rf "$LAB"
    return 0
}

env_for() { echo "export DOCKER_HOST=unix://$(node_sock "$1")"; }

case "${1:-}" in
    up) up ;;
    down) down ;;
    env) env_for "${2:?which node: 1, 2 or 3}" ;;
    stop) stop_engine "${2:?which node: 1, 2 or 3}" ;;   # a node lost: its engine stopped, the rest kept
    start) start_engine "${2:?which node: 1, 2 or 3}" ;;  # ...and back
    *) echo "usage: $0 up|down|env N|stop N|start N" >&2; exit 2 ;;
esac
