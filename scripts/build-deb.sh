#!/usr/bin/env bash
# Builds the DKMS package of the module, build/deb/pcieipc-dkms_<version>_all.deb:
#   /usr/src/pcieipc-<version>/       the module's sources, dkms.conf, the pre-build hook
#   /usr/sbin/pcieipc-prepare-kernel-rust
# On install it builds pcieipc.ko for every installed kernel that has headers.
#   scripts/build-deb.sh                  the .deb; prints DEB=<path>
#   scripts/build-deb.sh --sources DIR   only copies the module's sources to DIR
#                                         (what the package ships; scripts/distro-kmod.sh builds them)
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"

version="$(sed -n 's/.*MODULE_VERSION: &CStr = c"\([^"]*\)";.*/\1/p' kmod/chardev.rs)"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "cannot read the module's version from kmod/chardev.rs (got '$version')"

# The module build reads exactly these: the Kbuild files, the crate and its C
# wrappers, and the UAPI (header and the bindgen output kmod/uapi.rs includes).
copy_sources() {
    local dest="$1"
    mkdir -p "$dest/kmod" "$dest/include/uapi" "$dest/userspace/uapi/src"
    cp Kbuild "$dest/"
    cp kmod/Kbuild kmod/*.rs "$dest/kmod/"
    # *.mod.c is kbuild's output, not a source.
    find kmod -maxdepth 1 -name '*.c' ! -name '*.mod.c' -exec cp {} "$dest/kmod/" \;
    cp include/uapi/pcieipc.h "$dest/include/uapi/"
    cp userspace/uapi/src/generated.rs "$dest/userspace/uapi/src/"
}

if [ "${1:-}" = --sources ]; then
    [ $# = 2 ] || die "usage: scripts/build-deb.sh --sources DIR"
    copy_sources "$2"
    exit 0
fi
[ $# = 0 ] || die "usage: scripts/build-deb.sh [--sources DIR]"

stage="$REPO_ROOT/build/deb/stage"
rm -rf "$stage"; mkdir -p "$stage/DEBIAN" "$stage/usr/sbin"
src="$stage/usr/src/pcieipc-$version"
copy_sources "$src"
sed "s/@VERSION@/$version/g" packaging/dkms.conf >"$src/dkms.conf"
sed "s/@VERSION@/$version/g" packaging/dkms-pre-build.sh >"$src/dkms-pre-build.sh"
chmod 0755 "$src/dkms-pre-build.sh"
install -m 0755 packaging/prepare-kernel-rust.sh "$stage/usr/sbin/pcieipc-prepare-kernel-rust"
sed "s/@VERSION@/$version/g" packaging/dkms.postinst >"$stage/DEBIAN/postinst"
sed "s/@VERSION@/$version/g" packaging/dkms.prerm >"$stage/DEBIAN/prerm"
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm"
cat >"$stage/DEBIAN/control" <<CONTROL
Package: pcieipc-dkms
Version: $version
Architecture: all
Maintainer: pcieipc developers <pcieipc@localhost>
Depends: dkms (>= 3.0), make, xz-utils
Recommends: linux-headers-amd64 | linux-headers-generic
Suggests: linux-source
Section: kernel
Priority: optional
Installed-Size: $(du -sk "$stage/usr" | cut -f1)
Description: pcieipc kernel module (Rust) as DKMS source
 pcieipc.ko gives PCIe link control, AER events and, for devices it binds
 (ivshmem, NTB, DMA engines), BAR windows, MSI-X waits and DMA to the
 pcieipc AllReduce library. It is written in Rust: the kernel must have
 CONFIG_RUST=y and its headers the Rust artifacts (Ubuntu: linux-lib-rust;
 Debian: run pcieipc-prepare-kernel-rust once per kernel).
CONTROL
deb="$REPO_ROOT/build/deb/pcieipc-dkms_${version}_all.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null || die "dpkg-deb failed"
rm -rf "$stage"
echo "DEB=$deb"
