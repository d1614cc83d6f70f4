#!/usr/bin/env bash
# Runs one topology file + guest script in the testbed, with the module and
# the userspace programs in the guest:
#   [PCIEIPC_CONSOLE_LOG=FILE] scripts/testbed.sh [--distro] TOPOLOGY GUEST [HOST-SCRIPT]
# --distro boots Debian's packaged kernel (the vmlinuz a server installs) with
# the pcieipc.ko built against its headers by scripts/distro-kmod.sh, instead
# of the testbed's own kernel and module.
source "$(dirname "$0")/common.sh"
distro=0
if [ "${1:-}" = --distro ]; then distro=1; shift; fi
[ $# -ge 2 ] || die "usage: scripts/testbed.sh [--distro] TOPOLOGY GUEST-SCRIPT [HOST-SCRIPT]"
[ -f "$REPO_ROOT/build/env.sh" ] || die "nothing built yet: run 'make build' first"
source "$REPO_ROOT/build/env.sh"
kernel="$PCIEIPC_KERNEL"; module="$PCIEIPC_MODULE"
if [ "$distro" = 1 ]; then
    [ -f "$REPO_ROOT/build/distro/env.sh" ] ||
        die "no module built for Debian's kernel yet: run scripts/distro-kmod.sh first"
    source "$REPO_ROOT/build/distro/env.sh"
    kernel="$DISTRO_KERNEL"; module="$DISTRO_MODULE"
fi
args=(run --topology "$1" --guest "$2" --kernel "$kernel" --module "$module"
      --bin "$PCIEIPC_BIN/pcieipc" --bin "$PCIEIPC_BIN/pcieipc-guest" --bin "$PCIEIPC_BIN/pcieipc-fault-check")
[ $# -ge 3 ] && args+=(--host-script "$3")
# PCIEIPC_CONSOLE_LOG: keep the whole guest console in that file, and leave
# the guest's kernel log out of the echo unless the run fails.
[ -n "${PCIEIPC_CONSOLE_LOG:-}" ] && args+=(--console-log "$PCIEIPC_CONSOLE_LOG")
exec "$PCIEIPC_BIN/pcieipc-testbed" "${args[@]}"
