#!/usr/bin/env bash
# Tests the DKMS package as a Debian server would use it, in the trixie root
# of scripts/distro-kmod.sh (run that first), on Debian's packaged headers
# as shipped (their Rust artifacts set aside for the test):
#   1. without the kernel's source either: the package installs, builds
#      nothing, and says what is missing and what to do;
#   2. with the source back: `dkms install` prepares the headers (the
#      pre-build hook runs pcieipc-prepare-kernel-rust, a real
#      modules_prepare) and builds, signs and installs pcieipc.ko;
#   3. installing the package again (an upgrade) rebuilds it from its postinst;
#   4. removing the package removes the module.
source "$(dirname "$0")/common.sh"
[ -f "$REPO_ROOT/build/distro/env.sh" ] || die "run scripts/distro-kmod.sh first"
source "$REPO_ROOT/build/distro/env.sh"
in_root() { in_distro_root "$DISTRO_ROOT" "$@"; }

deb="$(bash "$REPO_ROOT/scripts/build-deb.sh" | sed -n 's/^DEB=//p')"
[ -f "$deb" ] || die "scripts/build-deb.sh made no package"
version="$(dpkg-deb -f "$deb" Version)"
package="/var/tmp/$(basename "$deb")"
headers="$DISTRO_ROOT/usr/src/linux-headers-$DISTRO_RELEASE"
installed="/lib/modules/$DISTRO_RELEASE/updates/dkms/pcieipc.ko"
[ -d "$headers/rust" ] || die "$headers has no rust/: run scripts/distro-kmod.sh first"

series="$(echo "$DISTRO_RELEASE" | cut -d. -f1-2)"
source_tarball="$DISTRO_ROOT/usr/src/linux-source-$series.tar.xz"
[ -f "$source_tarball" ] || die "$source_tarball is missing: run scripts/distro-kmod.sh first"

# What the test sets aside is always put back: the headers' artifacts as
# distro-kmod.sh made them, and the source.
aside="$DISTRO_ROOT/var/tmp/pcieipc-dkms-test-aside"
cleanup() {
    in_root dpkg --purge pcieipc-dkms >/dev/null 2>&1 || true
    if [ -d "$aside/rust" ]; then rm -rf "$headers/rust"; mv "$aside/rust" "$headers/rust"; fi
    if [ -f "$aside/source.tar.xz" ]; then mv "$aside/source.tar.xz" "$source_tarball"; fi
    rm -rf "$aside" "$DISTRO_ROOT$package"
}
trap cleanup EXIT
cleanup
mkdir -p "$aside"
cp "$deb" "$DISTRO_ROOT$package"

# Runs COMMAND... in the root; its output in $out (and echoed), status in $rc.
run_root() {
    out="$(in_root "$@" 2>&1)" && rc=0 || rc=$?
    echo "$out" | sed "s/^/    $1: /"
}
check_installed() {
    status="$(in_root dkms status -m pcieipc)"
    check "dkms status: installed for $DISTRO_RELEASE" grep -qxF "pcieipc/$version, $DISTRO_RELEASE, x86_64: installed" <<<"$status"
    check "pcieipc.ko is in /lib/modules/$DISTRO_RELEASE/updates/dkms" test -f "$DISTRO_ROOT$installed"
    [ -f "$DISTRO_ROOT$installed" ] || return 0
    vermagic="$(in_root modinfo -F vermagic "$installed")"
    check "its vermagic is $DISTRO_RELEASE ('$vermagic')" test "${vermagic%% *}" = "$DISTRO_RELEASE"
    # What Secure Boot checks: DKMS signed it with the key whose certificate
    # the user enrolls (mokutil --import /var/lib/dkms/mok.pub).
    check "it is signed with DKMS's key" test "$(in_root modinfo -F signer "$installed")" = "DKMS module signing key"
}

echo "1. Debian's headers as shipped, no kernel source"
mv "$headers/rust" "$aside/rust"
mv "$source_tarball" "$aside/source.tar.xz"
run_root dpkg -i "$package"
check "dpkg -i succeeds" test "$rc" = 0
check "postinst names the kernel it could not build for" grep -qF "pcieipc: NOT built for: $DISTRO_RELEASE" <<<"$out"
check "and the missing source, with the package to install" \
    grep -qF "no kernel source at /usr/src/linux-source-$series.tar.xz (Debian: apt install linux-source-$series" <<<"$out"
check "and the missing artifacts" \
    grep -qF "the kernel's headers lack its Rust artifacts: /usr/src/linux-headers-$DISTRO_RELEASE/rust/*.rmeta" <<<"$out"
check "and what the kernel was built with" grep -qF "the kernel was built with: rustc 1." <<<"$out"
check "and the command that finishes the job" grep -qF "then run: dkms install pcieipc/$version -k $DISTRO_RELEASE" <<<"$out"
check "no module installed" test ! -e "$DISTRO_ROOT$installed"

echo "2. the source back: dkms install prepares the headers and builds"
mv "$aside/source.tar.xz" "$source_tarball"
run_root dkms install -m pcieipc -v "$version" -k "$DISTRO_RELEASE"
check "dkms install succeeds" test "$rc" = 0
check "the headers got their Rust artifacts" in_root pcieipc-prepare-kernel-rust --check "$DISTRO_RELEASE"
check_installed

echo "3. the package installed again (an upgrade)"
run_root dpkg -i "$package"
check "dpkg -i succeeds" test "$rc" = 0
check "postinst built the module for $DISTRO_RELEASE" grep -qF "pcieipc: built and installed for $DISTRO_RELEASE" <<<"$out"
check_installed

echo "4. removal"
in_root dpkg --purge pcieipc-dkms >/dev/null 2>&1
check "dpkg --purge removes the module" test ! -e "$DISTRO_ROOT$installed"
check "and DKMS forgets it" test -z "$(in_root dkms status -m pcieipc)"
[ "$failed" = 0 ] || die "DKMS package test failed"
echo "DKMS package: all checks passed"
