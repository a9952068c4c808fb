# The network of a multi-node test cluster (sourced by start_slurm.sh and stop_slurm.sh, with D set
# to the state directory): a bridge on the host holding the controller's address, and per node a
# network namespace joined to it by a veth pair, whose slurmd also has a UTS namespace (its own
# hostname) and a mount namespace (in which /etc/hosts names every node, and /dev/shm is its own).
# Jobs inherit all three, so `scontrol show hostnames` names resolve inside them, and each node has
# its own loopback, ports and shared memory.
# Every name here starts with e3dg, so that the cluster's teardown touches nothing else.

BRIDGE=e3dgbr0
NET=10.251.93
BRIDGE_ADDR=$NET.1

node_addr() { echo "$NET.$((10 + $1))"; }

netns_of() { echo "e3dg-node$1"; }

teardown_network() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^e3dg-node/ {print $1}'); do
        # Whatever still runs on a node goes with it (slurmd was stopped by its PID file before).
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
        ip netns delete "$ns"
    done
    ip link delete "$BRIDGE" 2>/dev/null
    rm -f "$D/network"
    return 0
}

setup_network() {
    local n ns
    teardown_network
    ip link add "$BRIDGE" type bridge || return 1
    ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE" && ip link set "$BRIDGE" up || return 1
    {
        echo "127.0.0.1 localhost"
        echo "$BRIDGE_ADDR $(hostname -s)"
        for n in $(seq "$NODES"); do echo "$(node_addr "$n") node$n"; done
    } > "$D/hosts"
    for n in $(seq "$NODES"); do
        ns="$(netns_of "$n")"
        ip netns add "$ns" || return 1
        ip link add "e3dgv$n" type veth peer name "e3dgp$n" || return 1
        ip link set "e3dgp$n" netns "$ns"
        ip -n "$ns" link set "e3dgp$n" name eth0
        ip -n "$ns" addr add "$(node_addr "$n")/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        ip link set "e3dgv$n" master "$BRIDGE" up || return 1
    done
    echo "$NODES" > "$D/network"
}

# `ip netns exec` would remount /sys (and the cgroups with it) and set no hostname: nsenter + unshare.
# Each node gets its own /dev/shm, as a real node has: processes on two nodes that shared one would
# take each other for neighbours (SGLang then talks through shared memory and the other's loopback).
start_node_slurmd() {
    nsenter --net="/run/netns/$(netns_of "$1")" -- unshare --uts --mount -- sh -c \
        "mount --bind '$D/hosts' /etc/hosts && mount -t tmpfs -o size=4g tmpfs /dev/shm && hostname node$1 && exec slurmd -N node$1"
}
