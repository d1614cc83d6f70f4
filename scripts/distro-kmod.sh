#!/usr/bin/env bash
# Builds pcieipc.ko for a Debian kernel as a user's server would: against the
# packaged linux-headers, after giving them the Rust artifacts Debian does not
# ship (packaging/prepare-kernel-rust.sh, the script the .deb installs).
#   scripts/distro-kmod.sh [KERNEL-RELEASE]     (default: Debian's newest amd64 kernel of
#                                                KERNEL_SERIES, common.sh: 7.3.x in trixie-backports)
# Everything happens in a Debian trixie chroot ($PCIEIPC_CACHE/distro/trixie,
# made once with debootstrap), so the host is untouched: the kernel was built
# with trixie's rustc 1.85.1, bindgen and gcc-14, and crate metadata is only
# accepted by the rustc that made it. The prepared artifacts are cached per
# kernel release and package version ($PCIEIPC_CACHE/distro/rust-artifacts).
# Output, on stdout and in build/distro/env.sh:
#   DISTRO_RELEASE=<release>  DISTRO_KERNEL=<vmlinuz>  DISTRO_MODULE=<pcieipc.ko>
#   DISTRO_ROOT=<the chroot>
source "$(dirname "$0")/common.sh"

DISTRO="$PCIEIPC_CACHE/distro"
ROOT="$DISTRO/trixie"
SUITE=trixie
# The chroot's base: what modules_prepare, a module build and DKMS need
# (openssl: the kernel's configuration asks it which signature schemes exist;
# python3: the BTF tools' build; man-db and bash-completion: the tools
# package's pages and completions, scripts/test-dist.sh). The kernel's own
# toolchain (rustc, bindgen, gcc) is installed per release below.
BASE_PACKAGES=make,flex,bison,bc,libelf-dev,libssl-dev,openssl,python3,kmod,cpio,xz-utils,dkms,dwarves,man-db,bash-completion

release="${1:-}"
if [ -z "$release" ]; then
    foreign_apt_update
    release="$(foreign_apt_cache pkgnames "linux-headers-$KERNEL_SERIES." 2>/dev/null |
        sed -n 's/^linux-headers-\([0-9.]*+deb[0-9]*-amd64\)$/\1/p' | sort -V | tail -1)"
    [ -n "$release" ] || die "Debian (trixie, trixie-backports) has no linux-headers-$KERNEL_SERIES.*-amd64"
fi
[[ "$release" =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?\+deb[0-9]+-amd64$ ]] ||
    die "'$release' is not a Debian amd64 kernel release (like 7.3.4+deb13-amd64)"
version="$(foreign_newest "linux-headers-$release")"
[ -n "$version" ] || die "Debian has no linux-headers-$release (trixie, trixie-backports)"
series="${release%%.*}.$(echo "$release" | cut -d. -f2)"
series="${series%%+*}"

in_root() { in_distro_root "$ROOT" "$@"; }

if [ ! -f "$ROOT/.complete" ]; then
    command -v debootstrap >/dev/null || die "debootstrap is missing: run scripts/setup-host.sh"
    log "debootstrap $SUITE into $ROOT (a few minutes, once)"
    rm -rf "$ROOT" "$ROOT.tmp"; mkdir -p "$DISTRO"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$ROOT.tmp" "$DEBIAN_MIRROR" \
        >"$DISTRO/debootstrap.log" 2>&1 ||
        { tail -20 "$DISTRO/debootstrap.log" >&2; die "debootstrap $SUITE failed (log: $DISTRO/debootstrap.log)"; }
    printf 'deb %s %s main\ndeb %s %s-backports main\n' "$DEBIAN_MIRROR" "$SUITE" "$DEBIAN_MIRROR" "$SUITE" \
        >"$ROOT.tmp/etc/apt/sources.list"
    mv "$ROOT.tmp" "$ROOT"
    touch "$ROOT/.complete"
fi

root_apt() { in_root apt-get -q -o Dpkg::Use-Pty=0 "$@"; }
# Installs what is missing of PACKAGE=VERSION... (a bare name: any version).
root_install() {
    local missing=() p
    for p in "$@"; do
        local installed
        installed="$(in_root dpkg-query -W -f='${Status} ${Version}' "${p%%=*}" 2>/dev/null || true)"
        case "$p" in
            *=*) [ "$installed" = "install ok installed ${p#*=}" ] || missing+=("$p") ;;
            *) [ "${installed#install ok installed }" != "$installed" ] || missing+=("$p") ;;
        esac
    done
    [ "${#missing[@]}" = 0 ] && return 0
    log "chroot: installing ${missing[*]}"
    root_apt update >/dev/null || die "apt-get update in the $SUITE chroot failed"
    DEBIAN_FRONTEND=noninteractive root_apt install -y --no-install-recommends "${missing[@]}" >"$DISTRO/apt.log" 2>&1 ||
        { tail -20 "$DISTRO/apt.log" >&2; die "installing ${missing[*]} in the chroot failed (log: $DISTRO/apt.log)"; }
}
root_install ${BASE_PACKAGES//,/ } "linux-headers-$release=$version" "linux-source-$series=$version"

# The kernel's toolchain, read from its configuration: Debian builds from its
# own suite's packages, so the versions name the packages.
headers="/usr/src/linux-headers-$release"
config_text() { sed -n "s/^CONFIG_$1=\"\\(.*\\)\"\$/\\1/p" "$ROOT$headers/.config"; }
rustc_version="$(config_text RUSTC_VERSION_TEXT | awk '{print $2}')"
bindgen_version="$(config_text BINDGEN_VERSION_TEXT | awk '{print $2}')"
cc_text="$(config_text CC_VERSION_TEXT)"
gcc_package="$(echo "${cc_text%% *}" | sed -n 's/^x86_64-linux-gnu-\(gcc-[0-9]*\)$/\1/p')"
[ -n "$rustc_version" ] || die "$release: no CONFIG_RUSTC_VERSION_TEXT in its .config (built without Rust?)"
[ -n "$gcc_package" ] || die "$release was built with '$cc_text', which this script cannot map to a Debian gcc package"
# The newest Debian version of PACKAGE whose upstream part is UPSTREAM.
root_version() {
    in_root apt-cache madison "$1" | awk -F'|' '{gsub(/ /,"",$2); print $2}' |
        { grep -E "^${2//./\\.}[+-]" || true; } | sort -V | tail -1
}
want=()
for p in "rustc $rustc_version" "rust-src $rustc_version" "bindgen $bindgen_version"; do
    v="$(root_version $p)"
    [ -n "$v" ] || die "$SUITE has no ${p% *} at version ${p#* } (what $release was built with)"
    want+=("${p% *}=$v")
done
want+=("$gcc_package")
toolchain_ok() {
    in_root sh -c "rustc --version; bindgen --version; ${cc_text%% *} --version | head -1" 2>/dev/null |
        diff -q - <(config_text RUSTC_VERSION_TEXT; config_text BINDGEN_VERSION_TEXT; echo "$cc_text") >/dev/null
}
if ! toolchain_ok; then
    root_install "${want[@]}"
    toolchain_ok || die "the chroot's toolchain does not match what $release was built with: $(config_text RUSTC_VERSION_TEXT); $(config_text BINDGEN_VERSION_TEXT); $cc_text"
fi

install -m 0755 "$REPO_ROOT/packaging/prepare-kernel-rust.sh" "$ROOT/usr/local/sbin/pcieipc-prepare-kernel-rust"
artifacts="$DISTRO/rust-artifacts/$release-$version.tar"
if ! in_root pcieipc-prepare-kernel-rust --check "$release" 2>/dev/null; then
    if [ -f "$artifacts" ]; then
        log "restoring the Rust artifacts of $release from $artifacts"
        tar -xf "$artifacts" -C "$ROOT" || die "cannot unpack $artifacts"
    else
        in_root pcieipc-prepare-kernel-rust "$release" || die "preparing the Rust artifacts of $release failed"
    fi
    in_root pcieipc-prepare-kernel-rust --check "$release" || die "the headers of $release still lack Rust artifacts"
fi
if [ ! -f "$artifacts" ]; then
    kbuild_scripts="$(in_root readlink -f "$headers/scripts")"
    mkdir -p "$(dirname "$artifacts")"
    (cd "$ROOT" && tar -cf "$artifacts.tmp" ."$headers/rust" ."$kbuild_scripts/target.json") &&
        mv "$artifacts.tmp" "$artifacts" || die "cannot save $artifacts"
fi

# The module, built in the chroot from a copy of what the DKMS package ships.
log "building pcieipc.ko against linux-headers-$release (rustc $rustc_version)"
work="$ROOT/var/tmp/pcieipc-kmod"
rm -rf "$work"; mkdir -p "$work"
bash "$REPO_ROOT/scripts/build-deb.sh" --sources "$work"
in_root make -s -C "$headers" M=/var/tmp/pcieipc-kmod modules >"$DISTRO/kmod-build.log" 2>&1 ||
    { cat "$DISTRO/kmod-build.log" >&2; die "building pcieipc.ko against linux-headers-$release failed"; }
out="$REPO_ROOT/build/distro/$release"
mkdir -p "$out"
cp "$work/kmod/pcieipc.ko" "$out/pcieipc.ko"
vermagic="$(modinfo -F vermagic "$out/pcieipc.ko")"
[ "${vermagic%% *}" = "$release" ] || die "pcieipc.ko says vermagic '$vermagic', not $release"

# The kernel image, from the package a server installs (signed, as shipped).
image="$DISTRO/linux-binary-$release-$version"
foreign_extract "linux-binary-$release" "$version" "$image"
vmlinuz="$image/usr/lib/modules/$release/vmlinuz"
[ -f "$vmlinuz" ] || die "linux-binary-$release $version has no usr/lib/modules/$release/vmlinuz"

log "built $out/pcieipc.ko for $release ($vermagic)"
# For scripts/testbed.sh --distro and scripts/test-dkms.sh.
cat >"$REPO_ROOT/build/distro/env.sh" <<ENV
DISTRO_RELEASE=$release
DISTRO_KERNEL=$vmlinuz
DISTRO_MODULE=$out/pcieipc.ko
DISTRO_ROOT=$ROOT
ENV
cat "$REPO_ROOT/build/distro/env.sh"
