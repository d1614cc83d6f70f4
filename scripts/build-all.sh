#!/usr/bin/env bash
# Builds everything: host prerequisites, the testbed kernel (cached), the
# module against it, and the userspace workspace (release). Writes
# build/env.sh with the paths the other scripts use.
source "$(dirname "$0")/common.sh"
bash "$REPO_ROOT/scripts/setup-host.sh"
. "$PCIEIPC_CACHE/env.sh"

KERNEL_BUILD="$(bash "$REPO_ROOT/scripts/build-kernel.sh" | sed -n 's/^KERNEL_BUILD=//p')"
[ -n "$KERNEL_BUILD" ] || die "the kernel build did not report its directory"

log "building pcieipc.ko"
make -s -C "$KERNEL_BUILD" M="$REPO_ROOT" LLVM= modules ||
    die "building the module failed (kmod/)"
[ -f "$REPO_ROOT/kmod/pcieipc.ko" ] || die "kmod/pcieipc.ko was not produced"

log "building userspace (release)"
cargo build -q --release --workspace --manifest-path "$REPO_ROOT/Cargo.toml" ||
    die "building userspace failed"

mkdir -p "$REPO_ROOT/build"
cat >"$REPO_ROOT/build/env.sh" <<ENV
. "$PCIEIPC_CACHE/env.sh"
export PCIEIPC_KERNEL_BUILD="$KERNEL_BUILD"
export PCIEIPC_KERNEL="$KERNEL_BUILD/arch/x86/boot/bzImage"
export PCIEIPC_MODULE="$REPO_ROOT/kmod/pcieipc.ko"
export PCIEIPC_BIN="$REPO_ROOT/target/release"
export PATH="$REPO_ROOT/target/release:\$PATH"
ENV
log "built: kernel $KERNEL_BUILD, module kmod/pcieipc.ko, userspace target/release"
