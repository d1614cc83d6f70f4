#!/usr/bin/env bash
# `make dist` as a server would use it, without a Rust toolchain:
#   scripts/test-dist.sh wheel   the wheel (scripts/build-dist.sh) into a fresh
#       virtual environment whose PATH has no cargo or rustc: `pcieipc
#       --version` names this checkout's commit, `pcieipc probe` reports what
#       this tree's build reports (this machine and the dgx8 fixture), `pcieipc
#       bench` runs a checked AllReduce, `import pcieipc.torch` comes from the
#       wheel, and the README's Python example runs as written on 2 ranks
#       (torch is the tests' cached one, seen through a .pth file: the 3.8 GB
#       are not fetched twice; pcieipc itself only comes from the wheel);
#   scripts/test-dist.sh deb     pcieipc_<version>_amd64.deb into the Debian
#       root of scripts/distro-kmod.sh (run that first): the command, `man
#       pcieipc`, a subcommand's page, bash completion and the unit are there;
#       a purge leaves none of its files and removes the event store.
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"
[ -f build/env.sh ] || die "nothing built yet: run 'make build' first"
source build/env.sh
use_work_dir


# What `pcieipc --version` must name: the workspace's version and this
# checkout's commit, as the CLI's build.rs reads it.
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
commit="$(git describe --always --dirty --abbrev=12)"

test_wheel() {
    local python wheel venv site out
    python="$(bash scripts/setup-python.sh | sed -n 's/^PYTHON=//p')"
    wheel="$(bash scripts/build-dist.sh wheel | sed -n 's/^WHEEL=//p')"
    [ -f "$wheel" ] || die "scripts/build-dist.sh made no wheel"
    venv="$work/venv"
    python3 -m venv "$venv" || die "python3 -m venv $venv failed"
    "$venv/bin/pip" install -q --disable-pip-version-check --no-index --no-deps "$wheel" ||
        die "pip install $wheel into a fresh virtual environment failed"
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/test-environment.pth"
    # The user's shell: the venv's bin first, the system's directories, nothing of cargo's.
    in_venv() {
        (cd "$work" && env -i HOME="$work" LC_ALL=C.UTF-8 OMP_NUM_THREADS=1 \
            PATH="$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "$@")
    }
    check "no cargo or rustc on the environment's PATH" in_venv sh -c '! command -v cargo && ! command -v rustc'
    check "pcieipc on PATH is the wheel's" test "$(in_venv sh -c 'command -v pcieipc')" = "$venv/bin/pcieipc"
    out="$(in_venv pcieipc --version)" || true
    echo "$out" | sed 's/^/    /'
    check "pcieipc --version names version and this commit" \
        grep -qxF "pcieipc $version (commit $commit)" <<<"$out"
    check "pcieipc probe --json of this machine equals this tree's build's" \
        cmp -s <(in_venv pcieipc probe --json) <("$PCIEIPC_BIN/pcieipc" probe --json)
    local fixture="$REPO_ROOT/tests/fixtures/sysfs/dgx8" gpus
    out="$(in_venv pcieipc probe --json --sysfs-root "$fixture")" || true
    gpus="$(python3 -c 'import json, sys; print(len(json.load(sys.stdin)["gpus"]))' <<<"$out" 2>/dev/null || echo "unreadable")"
    check "pcieipc probe of the dgx8 fixture finds its 8 GPUs (found $gpus)" test "$gpus" = 8
    check "... and equals this tree's build's report" \
        cmp -s <(echo "$out") <("$PCIEIPC_BIN/pcieipc" probe --json --sysfs-root "$fixture")
    out="$(in_venv pcieipc bench --nranks 2 -b 8 -e 512K -f 4 -n 5 -w 2 -c 1 --json)" || true
    check "pcieipc bench from the wheel: 2 ranks, 9 sizes from 8 B to 512 KiB, every result checked, none wrong" \
        python3 -c 'import json, sys; r = json.load(sys.stdin); assert r["check"] and r["wrong"] == 0 and len(r["results"]) == 9, r' <<<"$out"
    out="$(in_venv python -c 'import pcieipc, pcieipc.torch; print(pcieipc.__file__)')" || true
    check "import pcieipc.torch comes from the wheel ($out)" test "${out#"$site"/pcieipc/}" = __init__.py
    check "the README's Python example runs as written on 2 ranks (torchrun), from the wheel" \
        in_venv python -m pytest -q -p no:cacheprovider \
        "$REPO_ROOT/python/tests/test_examples.py::test_readme_python_example_runs_as_written"
}

test_deb() {
    [ -f build/distro/env.sh ] || die "run scripts/distro-kmod.sh first"
    source build/distro/env.sh
    local deb files out rc
    deb="$(bash scripts/build-dist.sh | sed -n 's/^DEB=//p')"
    [ -f "$deb" ] || die "scripts/build-dist.sh made no tools package"
    check "the package's version is the workspace's ($version)" test "$(dpkg-deb -f "$deb" Version)" = "$version"
    in_root() { in_distro_root "$DISTRO_ROOT" "$@"; }
    in_root dpkg --purge pcieipc >/dev/null 2>&1 || true
    local copy="/var/tmp/$(basename "$deb")"
    cp "$deb" "$DISTRO_ROOT$copy" || die "cannot copy $deb into $DISTRO_ROOT"
    trap 'rm -f "'"$DISTRO_ROOT$copy"'"; stop_started_and_remove_work' EXIT
    out="$(in_root dpkg -i "$copy" 2>&1)" && rc=0 || rc=$?
    echo "$out" | sed 's/^/    dpkg -i: /'
    check "dpkg -i $(basename "$deb") in the Debian root" test "$rc" = 0
    files="$(in_root dpkg -L pcieipc | while read -r path; do [ -d "$DISTRO_ROOT$path" ] || echo "$path"; done)"
    out="$(in_root pcieipc --version 2>&1)" || true
    echo "$out" | sed 's/^/    /'
    check "pcieipc --version there: $version, this commit, no module loaded" \
        grep -qxF "pcieipc $version (commit $commit)" <<<"$out"
    out="$(in_root man -P cat pcieipc 2>&1)" || true
    check "man pcieipc shows the page" grep -q "PCIe peer-to-peer AllReduce, topology and link health" <<<"$out"
    check "man pcieipc names its subcommands' pages" grep -q "pcieipc-link(1)" <<<"$out"
    out="$(in_root man -P cat pcieipc-link-retrain 2>&1)" || true
    check "man pcieipc-link-retrain says how to allow a link" grep -q "pcieipc link allow" <<<"$out"
    out="$(in_root bash -c '. /usr/share/bash-completion/completions/pcieipc && complete -p pcieipc' 2>&1)" || true
    check "bash completion for pcieipc ($out)" grep -q -- "-F _pcieipc pcieipc$" <<<"$out"
    check "zsh and fish completions" test -s "$DISTRO_ROOT/usr/share/zsh/vendor-completions/_pcieipc" -a \
        -s "$DISTRO_ROOT/usr/share/fish/vendor_completions.d/pcieipc.fish"
    check "the monitor's unit runs the packaged command" \
        grep -q "^ExecStart=/usr/bin/pcieipc monitor " "$DISTRO_ROOT/usr/lib/systemd/system/pcieipc-monitor.service"
    # What the monitor would have stored, which a purge takes too.
    mkdir -p "$DISTRO_ROOT/var/lib/pcieipc" && : >"$DISTRO_ROOT/var/lib/pcieipc/events.db"
    out="$(in_root dpkg --purge pcieipc 2>&1)" && rc=0 || rc=$?
    echo "$out" | sed 's/^/    dpkg --purge: /'
    check "dpkg --purge pcieipc" test "$rc" = 0
    forgotten() { ! in_root dpkg -s pcieipc >/dev/null 2>&1; }
    check "dpkg no longer knows pcieipc" forgotten
    local left=()
    while read -r path; do [ -e "$DISTRO_ROOT$path" ] && left+=("$path"); done <<<"$files"
    check "none of its $(wc -l <<<"$files") files is left (${left[*]:-none})" test "${#left[@]}" = 0
    check "the event store went with the purge" test ! -e "$DISTRO_ROOT/var/lib/pcieipc"
}

case "${1:-}" in
    wheel) test_wheel ;;
    deb) test_deb ;;
    *) die "usage: scripts/test-dist.sh wheel|deb" ;;
esac
[ "$failed" = 0 ] || die "the $1 test failed"
echo "dist $1: PASSED"
