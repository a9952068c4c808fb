#!/usr/bin/env bash
# Installs Debian's SLURM (controller, node daemon, client) and munge for the test cluster of
# tests/slurm/start_slurm.sh, and iproute2 for its multi-node form (ip: the bridge, the nodes'
# network namespaces; nsenter and unshare are util-linux's, always there). A no-op when they are
# already installed. Needs root.
set -euo pipefail

packages=(slurmctld slurmd slurm-client munge iproute2)

missing=()
for pkg in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

echo "installing ${missing[*]}" >&2
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}"
