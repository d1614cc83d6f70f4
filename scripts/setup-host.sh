#!/usr/bin/env bash
# Installs everything the testbed and the builds need on a Debian 12 machine and
# writes $PCIEIPC_CACHE/env.sh, which the other scripts source.
#   - bookworm packages through apt (compiler, kernel build tools, busybox, QEMU's libraries,
#     Chromium and chromedriver for the browser test of `pcieipc probe --html`,
#     debootstrap for the Debian root of scripts/distro-kmod.sh)
#   - QEMU 10.0 from bookworm-backports (7.2 cannot deliver correctable AER errors)
#   - rust-src equal to the installed rustc (the kernel needs core's source)
#   - bindgen-cli (kernel build and the UAPI bindings) and libclang >= 17 (PyPI wheel)
#   - Prometheus (the server and promtool: the metrics tests) and node_exporter (the monitor's
#     cost benchmark), without starting their services
# Idempotent: a second run only checks.
source "$(dirname "$0")/common.sh"

BINDGEN_VERSION=0.72.1
LIBCLANG_WHEEL_VERSION=18.1.1
APT_PACKAGES=(build-essential flex bison bc libelf-dev libssl-dev cpio xz-utils kmod
    busybox-static qemu-system-x86 python3 pkg-config openmpi-bin libopenmpi-dev
    chromium chromium-driver debootstrap)

mkdir -p "$PCIEIPC_CACHE"

# apt_install [--no-services] PACKAGE...: installs those not installed yet.
# --no-services, for packages whose postinst starts a daemon: where no systemd
# runs (a container), invoke-rc.d would start it through its init script and
# leave it running. A policy-rc.d that answers 101 ("action forbidden") for the
# install keeps them stopped; the tests start their own, on loopback, in
# temporary directories.
apt_install() {
    local no_services=0 p missing=() policy=/usr/sbin/policy-rc.d own_policy=0 installed=0
    if [ "$1" = --no-services ]; then no_services=1; shift; fi
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ "${#missing[@]}" -gt 0 ] || return 0
    if [ "$no_services" = 1 ]; then
        log "apt: installing ${missing[*]} (their services not started)"
        if [ ! -e "$policy" ]; then
            printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && own_policy=1
        fi
    else
        log "apt: installing ${missing[*]}"
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get -q update >/dev/null &&
        apt-get -q install -y --no-install-recommends "${missing[@]}" >/dev/null && installed=1
    [ "$own_policy" = 0 ] || rm -f "$policy"
    [ "$installed" = 1 ] || die "apt-get install ${missing[*]} failed"
}
apt_install "${APT_PACKAGES[@]}"
SERVICE_PACKAGES=(prometheus prometheus-node-exporter)
apt_install --no-services "${SERVICE_PACKAGES[@]}"
for tool in prometheus promtool prometheus-node-exporter; do
    command -v "$tool" >/dev/null || die "$tool is not on PATH after installing ${SERVICE_PACKAGES[*]}"
done

# QEMU 10 from bookworm-backports, unpacked beside the system's 7.2 (whose
# libraries it shares), used through its own firmware directory.
QEMU_VERSION="$(foreign_newest qemu-system-x86 '^1:10\..*~bpo12')"
[ -n "$QEMU_VERSION" ] || die "bookworm-backports has no qemu-system-x86 10.x"
QEMU_DIR="$PCIEIPC_CACHE/qemu-${QEMU_VERSION//[:~+]/_}"
foreign_extract qemu-system-x86 "$QEMU_VERSION" "$QEMU_DIR/x86"
foreign_extract qemu-system-data "$QEMU_VERSION" "$QEMU_DIR/data"
QEMU_BIN="$QEMU_DIR/x86/usr/bin/qemu-system-x86_64"
"$QEMU_BIN" --version >/dev/null 2>&1 || die "QEMU $QEMU_VERSION does not run here: $("$QEMU_BIN" --version 2>&1 | head -3)"

# rust-src for exactly this rustc.
RUSTC_VERSION="$(rustc --version | awk '{print $2}')"
RUST_SRC_VERSION="$(foreign_newest rust-src "^${RUSTC_VERSION//./\\.}\\+")"
[ -n "$RUST_SRC_VERSION" ] || die "no Debian rust-src package for rustc $RUSTC_VERSION in trixie-backports/trixie"
RUST_SRC_DIR="$PCIEIPC_CACHE/rust-src-$RUSTC_VERSION"
foreign_extract rust-src "$RUST_SRC_VERSION" "$RUST_SRC_DIR"
RUST_LIB_SRC="$RUST_SRC_DIR/usr/src/rustc-$RUSTC_VERSION/library"
[ -d "$RUST_LIB_SRC/core" ] || die "rust-src $RUST_SRC_VERSION has no core library at $RUST_LIB_SRC"

TOOLS="$PCIEIPC_CACHE/tools"
if ! "$TOOLS/bin/bindgen" --version 2>/dev/null | grep -q "$BINDGEN_VERSION"; then
    log "cargo install bindgen-cli $BINDGEN_VERSION"
    cargo install -q bindgen-cli --locked --version "$BINDGEN_VERSION" --root "$TOOLS" ||
        die "cargo install bindgen-cli $BINDGEN_VERSION failed"
fi

LIBCLANG_DIR="$PCIEIPC_CACHE/libclang-$LIBCLANG_WHEEL_VERSION"
if [ ! -f "$LIBCLANG_DIR/clang/native/libclang.so" ]; then
    log "pip: libclang $LIBCLANG_WHEEL_VERSION"
    python3 -m pip install -q --no-deps --target "$LIBCLANG_DIR" "libclang==$LIBCLANG_WHEEL_VERSION" ||
        die "pip install libclang==$LIBCLANG_WHEEL_VERSION failed"
fi

cat >"$PCIEIPC_CACHE/env.sh" <<ENV
export PCIEIPC_CACHE="$PCIEIPC_CACHE"
export PCIEIPC_QEMU="$QEMU_BIN"
export PCIEIPC_QEMU_FIRMWARE="$QEMU_DIR/data/usr/share/qemu"
export RUST_LIB_SRC="$RUST_LIB_SRC"
export LIBCLANG_PATH="$LIBCLANG_DIR/clang/native"
export BINDGEN="$TOOLS/bin/bindgen"
export PATH="$TOOLS/bin:\$PATH"
ENV
log "host ready: QEMU $QEMU_VERSION, rust-src $RUST_SRC_VERSION, bindgen $BINDGEN_VERSION, libclang $LIBCLANG_WHEEL_VERSION"
