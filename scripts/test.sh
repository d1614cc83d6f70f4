#!/usr/bin/env bash
# The test command: builds everything, checks the UAPI bindings against the
# header, runs the cargo tests and every guest test in the QEMU testbed, and
# prints one closing line. Any failing step fails the run; nothing is skipped.
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"
start=$(date +%s)
bash scripts/build-all.sh
source build/env.sh

passed=0; failed=0; failures=()
step() {
    local name="$1"; shift
    log "test: $name"
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$name"); fi
}

step "UAPI bindings regenerate without a diff" bash scripts/gen-uapi.sh --check
step "cargo test --workspace" cargo test -q --workspace --release
step "cargo clippy --workspace, GPU tests included (warnings are errors)" cargo clippy -q --workspace --all-targets --all-features --release -- -D warnings
step "cargo fmt --check" cargo fmt --all --check
step "kmod: CLIPPY=1 build (warnings are errors)" make -s -C "$PCIEIPC_KERNEL_BUILD" M="$REPO_ROOT" LLVM= CLIPPY=1 W=e modules
step "kmod: rustfmt --check (the kernel's .rustfmt.toml)" rustfmt --check --config-path "$PCIEIPC_KERNEL_BUILD/source/.rustfmt.toml" kmod/*.rs
step "kmod: no import cycle, raw bindings only in wrappers, # Safety on unsafe fns" bash -c 'scripts/check-kmod-imports.sh --self-test && scripts/check-kmod-imports.sh'

# Guest tests: TOPOLOGY GUEST-SCRIPT [HOST-SCRIPT]
while read -r topology guest host; do
    [ -n "$topology" ] || continue
    step "guest: $guest on $topology" bash scripts/testbed.sh "tests/topologies/$topology" "tests/guest/$guest" ${host:+"tests/host/$host"}
done <<'LIST'
fabric.toml tree.sh
fabric.toml module.sh
fabric.toml hostctl.sh unplug-ivs1.sh
fabric.toml fault.sh
fabric.toml aer.sh
fabric.toml hardening.sh
datapath.toml datapath-list.sh
datapath.toml datapath-ipc.sh
datapath.toml datapath-fuzz.sh
datapath.toml datapath-dma.sh
datapath.toml datapath-aer.sh
datapath.toml hardening-datapath.sh
hardening.toml hardening-mappings.sh
datapath.toml lockdown.sh
bigbar.toml long-copy.sh
ivshmem-quad.toml datapath-ring4.sh
engine-pcieipc.toml engine-pcieipc.sh
engine-aer.toml engine-aer.sh
LIST

echo
echo "GPU tests: NOT RUN (they need a GPU and are not part of this command: run 'make test-gpu' on a GPU machine, see README)."
echo "elapsed: $(( $(date +%s) - start )) s"
for f in "${failures[@]}"; do echo "failed: $f"; done
echo "steps: $passed passed, $failed failed"
[ "$failed" = 0 ]
