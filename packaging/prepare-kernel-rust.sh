#!/bin/sh
# pcieipc-prepare-kernel-rust [--check] [--source TARBALL] [KERNEL-RELEASE]
#
# Gives a distribution kernel's headers the Rust artifacts they do not ship, so
# that out-of-tree Rust modules (pcieipc.ko) build against them. Debian's
# linux-headers packages carry no rust/ (no *.rmeta, no proc-macro libraries)
# and no scripts/target.json; this regenerates them with `modules_prepare` on
# the kernel's own source and configuration, with exactly the compilers the
# kernel was built with (read from the headers' .config), then copies them in.
# Ubuntu ships the same artifacts as linux-lib-rust-$(uname -r): install that
# instead of running this.
#
# Needs: the headers (/usr/src/linux-headers-RELEASE), the source tarball
# (Debian: linux-source-X.Y), the kernel's rustc, rust-src, bindgen and C
# compiler, each at the version its .config names, and the kernel's build
# tools (make flex bison bc libelf-dev libssl-dev openssl python3 dwarves).
# About 2.5 minutes on 2 idle cores, more on busy ones.
#   --check   only report whether the headers have the artifacts (exit 1 if not)
set -eu

die() { printf 'pcieipc-prepare-kernel-rust: %s\n' "$*" >&2; exit 1; }
say() { printf 'pcieipc-prepare-kernel-rust: %s\n' "$*" >&2; }

check_only=0; source_tarball=""
while [ $# -gt 0 ]; do
    case "$1" in
        --check) check_only=1; shift ;;
        --source) [ $# -ge 2 ] || die "--source needs a tarball"; source_tarball="$2"; shift 2 ;;
        -h|--help) sed -n '2,16s/^# \{0,1\}//p' "$0"; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) break ;;
    esac
done
[ $# -le 1 ] || die "usage: pcieipc-prepare-kernel-rust [--check] [--source TARBALL] [KERNEL-RELEASE]"
release="${1:-$(uname -r)}"
case "$release" in
    */*|.*|"") die "'$release' is not a kernel release (like 7.3.4+deb13-amd64)" ;;
esac

headers="/lib/modules/$release/build"
[ -f "$headers/.config" ] || die "no headers for $release at $headers (Debian: apt install linux-headers-$release)"
headers="$(readlink -f "$headers")"
config="$headers/.config"

config_text() {
    sed -n "s/^CONFIG_$1=\"\\(.*\\)\"\$/\\1/p" "$config"
}
grep -qx 'CONFIG_RUST=y' "$config" ||
    die "kernel $release was built without Rust (CONFIG_RUST is not set): no Rust module can be loaded into it; pcieipc needs a kernel with CONFIG_RUST=y"

# The artifacts the module build reads: the crates' metadata, the proc-macro
# libraries, and the Rust target description kbuild passes to rustc.
kbuild_scripts="$(readlink -f "$headers/scripts")"
missing=""
ls "$headers"/rust/*.rmeta >/dev/null 2>&1 || missing="$missing $headers/rust/*.rmeta"
ls "$headers"/rust/libmacros.so >/dev/null 2>&1 || missing="$missing $headers/rust/libmacros.so"
[ -f "$kbuild_scripts/target.json" ] || missing="$missing $kbuild_scripts/target.json"
if [ -z "$missing" ]; then
    say "$release: Rust artifacts present"
    exit 0
fi
if [ "$check_only" = 1 ]; then
    say "$release: the kernel's headers lack its Rust artifacts:$missing"
    say "Ubuntu: apt install linux-lib-rust-$release. Debian: pcieipc-prepare-kernel-rust $release (needs linux-source and the toolchain below)."
    say "the kernel was built with: $(config_text RUSTC_VERSION_TEXT); $(config_text BINDGEN_VERSION_TEXT); $(config_text CC_VERSION_TEXT)"
    exit 1
fi

# The exact toolchain: crate metadata is only accepted by the rustc that made
# it, and the symbols' hashes must match the kernel's Module.symvers.
want_rustc="$(config_text RUSTC_VERSION_TEXT)"
want_bindgen="$(config_text BINDGEN_VERSION_TEXT)"
want_cc="$(config_text CC_VERSION_TEXT)"
cc="${want_cc%% *}"
have_rustc="$(rustc --version 2>/dev/null || echo 'no rustc')"
have_bindgen="$(bindgen --version 2>/dev/null | head -1 || echo 'no bindgen')"
have_cc="$("$cc" --version 2>/dev/null | head -1 || echo "no $cc")"
[ "$have_rustc" = "$want_rustc" ] ||
    die "kernel $release was built with '$want_rustc'; this machine has '$have_rustc' (Debian: the rustc package of the kernel's suite)"
[ "$have_bindgen" = "$want_bindgen" ] ||
    die "kernel $release was built with '$want_bindgen'; this machine has '$have_bindgen'"
[ "$have_cc" = "$want_cc" ] ||
    die "kernel $release was built with '$want_cc'; this machine has '$have_cc'"

# Debian's source package is per series: 7.3.4+deb13-amd64 -> linux-source-7.3.
version="$(echo "$release" | sed -n 's/^\([0-9]*\.[0-9]*\).*/\1/p')"
if [ -z "$source_tarball" ]; then
    source_tarball="/usr/src/linux-source-$version.tar.xz"
fi
[ -f "$source_tarball" ] || die "no kernel source at $source_tarball (Debian: apt install linux-source-$version, of the same version as the headers)"

work="$(mktemp -d "${TMPDIR:-/var/tmp}/pcieipc-prepare-$release.XXXXXX")"
trap 'rm -rf "$work"' EXIT
say "unpacking $source_tarball"
mkdir "$work/src" "$work/obj"
tar -xJf "$source_tarball" -C "$work/src" --strip-components=1 || die "cannot unpack $source_tarball"
cp "$config" "$work/obj/.config"
kmake() { make -s -C "$work/src" O="$work/obj" CC="$cc" KERNELRELEASE="$release" "$@"; }
kmake olddefconfig >/dev/null
# A source that is not the headers' own changes the configuration here.
cmp -s "$config" "$work/obj/.config" ||
    die "the configuration of $release does not hold for $source_tarball (olddefconfig changed it): the source is not the kernel's own version"
say "modules_prepare for $release (a few minutes)"
kmake -j"$(nproc)" modules_prepare >"$work/prepare.log" 2>&1 ||
    { tail -30 "$work/prepare.log" >&2; die "modules_prepare failed"; }

mkdir -p "$headers/rust"
cp "$work"/obj/rust/*.rmeta "$work"/obj/rust/*.so "$headers/rust/"
cp "$work/obj/scripts/target.json" "$kbuild_scripts/target.json"
say "$release: installed $(ls "$work"/obj/rust/*.rmeta | wc -l) crate metadata files, $(ls "$work"/obj/rust/*.so | wc -l) proc-macro libraries and target.json"
