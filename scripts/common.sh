# Shared helpers for the testbed scripts; sourced, never run.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Everything fetched or built for the testbed lives here, outside the clone, so
# that a fresh clone on the same machine reuses it (CI clones anew every run).
PCIEIPC_CACHE="${PCIEIPC_CACHE:-/var/cache/pcieipc}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# The kernel series the module is written for: the kernel crate's API changes
# incompatibly between series (7.2 -> 7.3 changed probe, IRQ handler and IRQ
# vector types), so the testbed kernel and the Debian kernel are both 7.3.x.
KERNEL_SERIES=7.3

log() { printf '[pcieipc %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[pcieipc] error: %s\n' "$*" >&2; exit 1; }

# A work directory ($work) and the background processes a script starts
# (their pids appended to $started): all stopped and removed when the script
# exits, however it exits.
use_work_dir() {
    work="$(mktemp -d)"
    started=()
    trap stop_started_and_remove_work EXIT
}
stop_started_and_remove_work() {
    local pid
    for pid in "${started[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${started[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ "${mps_started:-0}" = 1 ]; then echo quit | nvidia-cuda-mps-control >/dev/null || true; fi
    rm -rf "$work"
}

# An MPS daemon of the script's own, its pipe and log in $work (use_work_dir
# first), quit when the script exits: ranks sharing one GPU then run side by
# side instead of time-sliced.
start_mps_daemon() {
    command -v nvidia-cuda-mps-control >/dev/null || die "nvidia-cuda-mps-control is not here (MPS)"
    export CUDA_MPS_PIPE_DIRECTORY="$work/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$work/mps/log"
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d || die "starting the MPS daemon failed (log: $CUDA_MPS_LOG_DIRECTORY)"
    mps_started=1
}

# CUDA installs often keep libnvrtc outside the loader's path: their library
# directories go in front of LD_LIBRARY_PATH.
add_cuda_libraries() {
    local lib
    for lib in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        if [ -d "$lib" ]; then export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
    done
}

# The pcieipc a benchmark runs: $PCIEIPC when set, else this tree's, built.
pcieipc_command() {
    if [ -n "${PCIEIPC:-}" ]; then
        echo "$PCIEIPC"
        return
    fi
    cargo build --release -q -p pcieipc-cli >&2 || die "building pcieipc (cargo build -p pcieipc-cli) failed"
    echo "$REPO_ROOT/target/release/pcieipc"
}

# check WHAT COMMAND...: runs COMMAND and prints `PASS: WHAT` or `FAIL: WHAT`;
# a failure sets `failed=1` (the caller tests it at the end), so every check
# runs and reports.
failed=0
check() {
    local what="$1"; shift
    if "$@"; then echo "PASS: $what"; else echo "FAIL: $what"; failed=1; fi
}

# A TCP port free on loopback now.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# apt-cache over the private sources list of foreign_apt.
foreign_apt_cache() {
    apt-cache -o Dir::Etc::SourceList="$PCIEIPC_CACHE/apt/sources.list" \
        -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists="$PCIEIPC_CACHE/apt/lists" \
        -o Dir::Cache="$PCIEIPC_CACHE/apt/cache" "$@"
}

# apt-get over a private sources list, so that packages from other Debian suites
# (trixie-backports, bookworm-backports) are fetched without touching the
# system's apt configuration.
foreign_apt() {
    local dir="$PCIEIPC_CACHE/apt"
    apt-get -q -o Dir::Etc::SourceList="$dir/sources.list" \
        -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$dir/lists" \
        -o Dir::Cache="$dir/cache" \
        -o Debug::NoLocking=1 -o APT::Sandbox::User=root "$@"
}

foreign_apt_update() {
    local dir="$PCIEIPC_CACHE/apt"
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
    cat >"$dir/sources.list" <<SRC
deb $DEBIAN_MIRROR trixie-backports main
deb $DEBIAN_MIRROR trixie main
deb $DEBIAN_MIRROR bookworm-backports main
SRC
    # Refresh at most once a day: the lists are large and rarely matter more often.
    if [ -z "$(find "$dir/lists" -name '*Packages*' -mmin -1440 2>/dev/null | head -1)" ]; then
        foreign_apt update >/dev/null || die "cannot fetch Debian package lists from $DEBIAN_MIRROR (trixie-backports, bookworm-backports)"
    fi
}

# Newest version of PKG that the private lists know whose version matches the
# extended regex PATTERN; nothing (and success) when none does, so that the
# caller names what is missing.
foreign_newest() {
    local pkg="$1" pattern="${2:-.}"
    foreign_apt_update
    foreign_apt_cache madison "$pkg" 2>/dev/null |
        awk -F'|' '{gsub(/ /,"",$2); print $2}' | { grep -E "$pattern" || true; } | sort -V | tail -1
}

# Download PKG=VERSION and unpack it into DEST (once).
foreign_extract() {
    local pkg="$1" ver="$2" dest="$3"
    if [ -f "$dest/.extracted" ]; then return 0; fi
    foreign_apt_update
    local tmp; tmp="$(mktemp -d)"
    (cd "$tmp" && foreign_apt download "$pkg=$ver" >/dev/null) ||
        die "cannot download Debian package $pkg=$ver"
    rm -rf "$dest"; mkdir -p "$dest"
    dpkg -x "$tmp"/*.deb "$dest" || die "cannot unpack $pkg=$ver"
    rm -rf "$tmp"
    touch "$dest/.extracted"
}

# in_distro_root ROOT COMMAND...: runs COMMAND in the chroot ROOT (the Debian
# root of scripts/distro-kmod.sh) with /proc and /dev, in a private mount
# namespace so that nothing stays mounted when it ends.
in_distro_root() {
    unshare -m -- sh -c 'mount -t proc proc "$0/proc" && mount --bind /dev "$0/dev" &&
        exec chroot "$0" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root LC_ALL=C.UTF-8 "$@"' "$@"
}

# cached_venv NAME REQUIREMENTS [BEFORE [AFTER]]: prints the path of a virtual
# environment $PCIEIPC_CACHE/NAME-<key>, the key from python3's version and
# REQUIREMENTS, so a fresh clone on the same machine reuses it. Made once:
# the function BEFORE VENV first where given, then pip install -r
# REQUIREMENTS, then AFTER VENV (a check that dies on failure).
cached_venv() {
    local name="$1" requirements="$2" before="${3:-}" after="${4:-}" key venv
    command -v python3 >/dev/null || die "python3 is missing (scripts/setup-host.sh installs it)"
    python3 -c 'import venv, ensurepip' 2>/dev/null || {
        log "apt: installing python3-venv"
        DEBIAN_FRONTEND=noninteractive apt-get -q install -y --no-install-recommends python3-venv >/dev/null ||
            die "apt-get install python3-venv failed"
    }
    key="$( (python3 --version; cat "$requirements") | sha256sum | cut -c1-16)"
    venv="$PCIEIPC_CACHE/$name-$key"
    if [ ! -f "$venv/ready" ]; then
        log "python: making $venv ($(sed -n 's/==.*//p' "$requirements" | xargs))"
        rm -rf "$venv"
        python3 -m venv "$venv" || die "python3 -m venv $venv failed"
        [ -z "$before" ] || "$before" "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements" ||
            die "pip install -r $requirements failed"
        [ -z "$after" ] || "$after" "$venv"
        touch "$venv/ready"
    fi
    echo "$venv"
}
