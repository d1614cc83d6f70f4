#!/usr/bin/env bash
# make dist: what a server installs without a Rust toolchain, into build/dist/:
#   pcieipc-<version>-cp39-abi3-manylinux_2_27_x86_64.whl
#       the Python package (pcieipc, pcieipc.torch) and the pcieipc command,
#       which pip puts on PATH (the wheel's scripts, as ruff and uv ship theirs)
#   pcieipc_<version>_amd64.deb
#       /usr/bin/pcieipc, its man pages and bash/zsh/fish completions (both
#       generated from the CLI's definitions), the monitor's systemd unit
#   pcieipc-dkms_<version>_all.deb
#       the module as DKMS source (scripts/build-deb.sh)
# The command and the extension are linked by zig against glibc 2.27's
# symbols: the oldest the code links with (memfd_create is 2.27; Rust's std
# needs 2.25), so one build serves RHEL 8, Ubuntu 18.04, Debian 10 and later.
#
#   scripts/build-dist.sh          all three; prints WHEEL=, DEB= and DKMS_DEB=
#   scripts/build-dist.sh wheel    the wheel only; prints WHEEL=
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"

GLIBC=2.27
TARGET=x86_64-unknown-linux-gnu
MANYLINUX="manylinux_${GLIBC/./_}"
DIST="$REPO_ROOT/build/dist"

# The pcieipc command, linked for glibc $GLIBC; prints its path. Its own
# target directory: maturin's zig build of the extension sets other flags,
# and in one directory each build would make the other's crates stale.
build_command() {
    local target_dir="$REPO_ROOT/target/dist-command"
    cargo zigbuild --locked -q --profile dist -p pcieipc-cli --target "$TARGET.$GLIBC" \
        --target-dir "$target_dir" >&2 || die "cargo zigbuild of the pcieipc command failed"
    echo "$target_dir/$TARGET/dist/pcieipc"
}

build_wheel() {
    local command="$1" data
    # maturin puts <module>.data/scripts/ into the wheel's scripts; the
    # directory exists only while the wheel is built, so a source build
    # (`pip install ./python`) never ships a stale command.
    data="$REPO_ROOT/python/pcieipc._native.data"
    rm -rf "$data" "$DIST"/pcieipc-*.whl
    mkdir -p "$data/scripts"
    install -m 0755 "$command" "$data/scripts/pcieipc"
    (cd python && maturin build --locked --quiet --profile dist --zig --target "$TARGET" \
        --compatibility "$MANYLINUX" -o "$DIST" >&2) || { rm -rf "$data"; die "maturin build of the wheel failed"; }
    rm -rf "$data"
    local wheel
    wheel="$(ls "$DIST"/pcieipc-*-cp39-abi3-"$MANYLINUX"_x86_64.whl 2>/dev/null)" ||
        die "maturin made no cp39-abi3-${MANYLINUX}_x86_64 wheel in $DIST"
    # auditwheel reads every ELF file of the wheel, the command included.
    auditwheel show "$wheel" | tr '\n' ' ' | grep -q "consistent with the following platform tag: \"${MANYLINUX}_x86_64\"" ||
        die "auditwheel: $wheel is not ${MANYLINUX}_x86_64: $(auditwheel show "$wheel")"
    echo "WHEEL=$wheel"
}

build_tools_deb() {
    local command="$1" version stage deb
    version="$("$command" --version | sed -n 's/^pcieipc \([0-9.]*\) .*/\1/p')"
    [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "cannot read the version from $command --version"
    stage="$DIST/stage"
    rm -rf "$stage" "$DIST"/pcieipc_*_amd64.deb
    mkdir -p "$stage/DEBIAN" "$stage/usr/bin" "$stage/usr/share/doc/pcieipc" \
        "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions" \
        "$stage/usr/share/fish/vendor_completions.d" "$stage/usr/lib/systemd/system"
    install -m 0755 "$command" "$stage/usr/bin/pcieipc"
    "$command" man-pages "$stage/usr/share/man/man1" || die "pcieipc man-pages failed"
    gzip -9n "$stage"/usr/share/man/man1/*.1
    "$command" completions bash >"$stage/usr/share/bash-completion/completions/pcieipc"
    "$command" completions zsh >"$stage/usr/share/zsh/vendor-completions/_pcieipc"
    "$command" completions fish >"$stage/usr/share/fish/vendor_completions.d/pcieipc.fish"
    install -m 0644 packaging/pcieipc-monitor.service "$stage/usr/lib/systemd/system/"
    printf '%s\n' "pcieipc: AllReduce over PCIe peer-to-peer IPC, link control and events." \
        "License: GPL-2.0-only (/usr/share/common-licenses/GPL-2)." >"$stage/usr/share/doc/pcieipc/copyright"
    for script in postinst prerm postrm; do
        install -m 0755 "packaging/tools.$script" "$stage/DEBIAN/$script"
    done
    cat >"$stage/DEBIAN/control" <<CONTROL
Package: pcieipc
Version: $version
Architecture: amd64
Maintainer: pcieipc developers <pcieipc@localhost>
Depends: libc6 (>= $GLIBC)
Recommends: pcieipc-dkms (= $version)
Section: admin
Priority: optional
Installed-Size: $(du -sk "$stage/usr" | cut -f1)
Description: PCIe peer-to-peer AllReduce, topology and link health
 pcieipc probe reads the PCIe tree, link speed and width against capability,
 AER counters, NVLink and P2P readiness; pcieipc monitor streams and stores
 AER, link and device events and serves Prometheus metrics (the unit
 pcieipc-monitor.service, installed disabled: systemctl enable --now
 pcieipc-monitor); pcieipc link retrains and watches links through the
 pcieipc module (package pcieipc-dkms); pcieipc bench runs the AllReduce
 with nccl-tests' flags on shared memory, the module's devices and GPUs.
CONTROL
    deb="$DIST/pcieipc_${version}_amd64.deb"
    dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null || die "dpkg-deb failed"
    rm -rf "$stage"
    echo "DEB=$deb"
}

case "${1:-all}" in
    wheel | all) ;;
    *) die "usage: scripts/build-dist.sh [wheel]" ;;
esac
# The build tools (maturin, zig, cargo-zigbuild, auditwheel), cached.
export PATH="$(cached_venv dist-tools "$REPO_ROOT/python/requirements-dist.txt")/bin:$PATH"
mkdir -p "$DIST"
command="$(build_command)"
build_wheel "$command"
if [ "${1:-all}" = all ]; then
    build_tools_deb "$command"
    dkms_deb="$(bash scripts/build-deb.sh | sed -n 's/^DEB=//p')"
    cp "$dkms_deb" "$DIST/" || die "scripts/build-deb.sh made no package"
    echo "DKMS_DEB=$DIST/$(basename "$dkms_deb")"
fi
