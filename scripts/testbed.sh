#!/usr/bin/env bash
# Runs one topology file + guest script in the testbed, with the module and
# the userspace programs in the guest: scripts/testbed.sh TOPOLOGY GUEST [HOST-SCRIPT]
source "$(dirname "$0")/common.sh"
[ $# -ge 2 ] || die "usage: scripts/testbed.sh TOPOLOGY GUEST-SCRIPT [HOST-SCRIPT]"
[ -f "$REPO_ROOT/build/env.sh" ] || die "nothing built yet: run 'make build' first"
source "$REPO_ROOT/build/env.sh"
args=(run --topology "$1" --guest "$2" --module "$PCIEIPC_MODULE"
      --bin "$PCIEIPC_BIN/pcieipc" --bin "$PCIEIPC_BIN/pcieipc-guest" --bin "$PCIEIPC_BIN/pcieipc-fault-check")
[ $# -ge 3 ] && args+=(--host-script "$3")
exec "$PCIEIPC_BIN/pcieipc-testbed" "${args[@]}"
