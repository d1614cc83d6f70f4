#!/usr/bin/env bash
# Builds the testbed kernel: Debian's newest linux-source of KERNEL_SERIES
# (common.sh: 7.3.x), tinyconfig plus
# scripts/kernel/testbed.config, Rust enabled. The build lands in
# $PCIEIPC_CACHE/kernel/<key>, key = hash of (kernel version, rustc, bindgen,
# gcc, config fragment); a second run with the same key only prints the path.
# Output: the line "KERNEL_BUILD=<dir>" on stdout.
source "$(dirname "$0")/common.sh"
[ -f "$PCIEIPC_CACHE/env.sh" ] || bash "$REPO_ROOT/scripts/setup-host.sh"
source "$PCIEIPC_CACHE/env.sh"

FRAGMENT="$REPO_ROOT/scripts/kernel/testbed.config"
KVER="$(foreign_newest "linux-source-$KERNEL_SERIES" "^${KERNEL_SERIES//./\\.}\\.")"
[ -n "$KVER" ] || die "no linux-source-$KERNEL_SERIES $KERNEL_SERIES.x in trixie-backports (Debian may have moved it; set DEBIAN_MIRROR)"

key_input="linux-source $KVER
$(rustc --version)
$("$BINDGEN" --version)
$(gcc --version | head -1)
$(cat "$FRAGMENT")"
KEY="$(printf '%s' "$key_input" | sha256sum | cut -c1-16)"
BUILD="$PCIEIPC_CACHE/kernel/$KVER-$KEY"

if [ -f "$BUILD/.complete" ]; then
    echo "KERNEL_BUILD=$BUILD"
    exit 0
fi

SRC_PKG="$PCIEIPC_CACHE/linux-source-$KVER"
foreign_extract "linux-source-$KERNEL_SERIES" "$KVER" "$SRC_PKG"
SRC="$PCIEIPC_CACHE/linux-$KVER"
if [ ! -f "$SRC/.unpacked" ]; then
    log "unpacking linux-source $KVER"
    rm -rf "$SRC" "$SRC.tmp"; mkdir -p "$SRC.tmp"
    tar -xJf "$SRC_PKG/usr/src/linux-source-$KERNEL_SERIES.tar.xz" -C "$SRC.tmp" --strip-components=1 ||
        die "cannot unpack $SRC_PKG/usr/src/linux-source-$KERNEL_SERIES.tar.xz"
    mv "$SRC.tmp" "$SRC"; touch "$SRC/.unpacked"
fi

log "configuring $KVER into $BUILD"
rm -rf "$BUILD"; mkdir -p "$BUILD"
kmake() { make -C "$SRC" O="$BUILD" LLVM= "$@"; }
kmake -s tinyconfig >/dev/null
(cd "$BUILD" && "$SRC/scripts/kconfig/merge_config.sh" -m -O "$BUILD" .config "$FRAGMENT" >/dev/null)
kmake -s olddefconfig >/dev/null
kmake -s rustavailable || die "the kernel's Rust support is not available (see the lines above)"
# merge_config only warns; a silently dropped option would give a kernel that
# boots but lacks what the tests rely on, so check every line.
bad=0
while IFS= read -r line; do
    case "$line" in
        CONFIG_*=*) grep -qxF "$line" "$BUILD/.config" || { log "config: '$line' did not land"; bad=1; } ;;
        "# CONFIG_"*" is not set") grep -q "^${line#\# }" "$BUILD/.config" 2>/dev/null && { log "config: '$line' did not land"; bad=1; }
                                   opt="${line#\# }"; opt="${opt%% *}"; grep -q "^$opt=" "$BUILD/.config" && { log "config: $opt is set"; bad=1; } ;;
    esac
done <"$FRAGMENT"
[ "$bad" = 0 ] || die "kernel configuration is missing options of $FRAGMENT (dependencies unmet?)"

log "building bzImage and modules (a few minutes on 2 cores)"
# Its output goes to the log, so a line every 30 s says that it is still
# going and how far: minutes of silence look like a hang. The build stays in
# the foreground, where an interrupt reaches it.
kbuild_started=$(date +%s)
(
    next_report=30
    while sleep 1; do
        seconds=$(( $(date +%s) - kbuild_started ))
        if [ "$seconds" -ge "$next_report" ]; then
            log "kernel build: $seconds s, $(find "$BUILD" -name '*.o' | wc -l) objects compiled"
            next_report=$((next_report + 30))
        fi
    done
) >/dev/null &
heartbeat=$!
trap 'kill "$heartbeat" 2>/dev/null || true' EXIT
kmake -s -j"$(nproc)" bzImage modules >"$BUILD/build.log" 2>&1 ||
    { tail -40 "$BUILD/build.log" >&2; die "kernel build failed; log: $BUILD/build.log"; }
kill "$heartbeat"; trap - EXIT
touch "$BUILD/.complete"
log "kernel ready: $BUILD/arch/x86/boot/bzImage"
echo "KERNEL_BUILD=$BUILD"
