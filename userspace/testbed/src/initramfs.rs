//! The guest's initramfs: busybox, /init, the module, the guest programs with
//! the shared libraries they link, the guest script and its library.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use crate::tree::TreeLine;

/// Markers the guest prints on its console; the harness reads them.
pub const MARK_START: &str = "@@pcieipc-testbed guest-start";
pub const MARK_DMESG_BEGIN: &str = "@@pcieipc-testbed dmesg-begin";
pub const MARK_DMESG_END: &str = "@@pcieipc-testbed dmesg-end";
pub const MARK_EXIT: &str = "@@pcieipc-testbed exit=";

/// Where busybox-static puts its binary on Debian.
const BUSYBOX: &str = "/bin/busybox";

#[derive(Debug, thiserror::Error)]
pub enum InitramfsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Input { path: PathBuf, message: String },
    #[error("building the initramfs archive: {0}")]
    Archive(String),
}

pub struct Contents<'a> {
    pub guest_script: &'a Path,
    pub module: Option<&'a Path>,
    pub binaries: &'a [PathBuf],
    pub expected_tree: &'a [TreeLine],
    pub topology_text: &'a str,
}

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /sbin /usr/bin /usr/sbin
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
grep -q ' /dev ' /proc/mounts || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm && mount -t tmpfs tmpfs /tmp
# tracefs, where the kernel has tracing (the directory exists then): the
# tracefs event source of `pcieipc monitor` reads it.
[ -d /sys/kernel/tracing ] && mount -t tracefs tracefs /sys/kernel/tracing
# ttyS1 is the channel to the harness (see /testbed/lib.sh): raw, no echo.
exec 3<>/dev/ttyS1
stty -F /dev/ttyS1 raw -echo
echo "@@pcieipc-testbed guest-start"
cd /testbed
sh -e -c '. /testbed/lib.sh; . /testbed/guest.sh'
rc=$?
echo "@@pcieipc-testbed dmesg-begin"
dmesg
echo "@@pcieipc-testbed dmesg-end"
echo "@@pcieipc-testbed exit=$rc"
poweroff -f
"#;

/// `inject PORT ERROR`: injects the AER error ERROR on the root port PORT
/// through QEMU's monitor, and fails, saying what QEMU answered, unless QEMU
/// confirms it ("OK id: PORT ..."): QEMU answers a bad port or error name
/// with a message, not a failure, so a check that something "goes unseen"
/// could otherwise pass on nothing injected. A program, as `host` is.
const INJECT: &str = r#"#!/bin/sh
reply=$(host hmp "pcie_aer_inject_error $1 $2") || exit 1
case "$reply" in
    *"OK id: $1 "*) ;;
    *) echo "QEMU did not take $2 on $1: $reply" >&2; exit 1 ;;
esac
"#;

/// `host VERB ARGS...`: asks the harness on the host to act and prints its
/// answer; a program rather than a shell function so that `sh -c` and
/// `check` can use it. Verbs: `hmp COMMAND LINE` (a QEMU monitor command, e.g.
/// pcie_aer_inject_error), `unplug DEVICE-ID` (device_del, waits for the
/// removal). Fails when the host answers with an error. Uses fd 3, the
/// channel /init opens on ttyS1.
const HOST: &str = r#"#!/bin/sh
echo "$*" >&3
IFS= read -r reply <&3
case "$reply" in
    "ok "*|ok) echo "${reply#ok}" ;;
    *) echo "host $*: ${reply#err }" >&2; exit 1 ;;
esac
"#;

const LIB: &str = r#"# Sourced before every guest script.
PCIEIPC_PASSED=0
PCIEIPC_FAILED=0
# check DESCRIPTION COMMAND...: runs COMMAND; counts and prints the result.
check() {
    desc="$1"; shift
    if out="$("$@" 2>&1)"; then
        PCIEIPC_PASSED=$((PCIEIPC_PASSED + 1)); echo "PASS: $desc"
    else
        PCIEIPC_FAILED=$((PCIEIPC_FAILED + 1)); echo "FAIL: $desc"; echo "$out" | sed 's/^/    /'
    fi
}
# act_mid_sweep OUT ROW ACTION BENCH-ARG...: runs `pcieipc bench
# BENCH-ARG...` in the background into OUT, runs the command line ACTION once
# the sweep's row of ROW bytes is out, waits for the job and prints OUT.
# Returns the job's exit status (99 if ACTION failed, after the job);
# ACTED_MS is how long the job ran on after ACTION began, ACTION_MS how long
# ACTION itself took (a request to the host included), both to the 10 ms
# /proc/uptime gives (busybox's date has no sub-second format).
act_mid_sweep() {
    sweep_out="$1"; row="$2"; action="$3"; shift 3
    pcieipc bench "$@" > "$sweep_out" 2>&1 &
    bench=$!
    for i in $(seq 600); do grep -q "^ *$row " "$sweep_out" && break; sleep 0.1; done
    acted=$(awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime)
    sh -c "$action"; taken=$?
    ACTION_MS=$(( $(awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime) - acted ))
    wait $bench; rc=$?
    [ "$taken" = 0 ] || rc=99
    ACTED_MS=$(( $(awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime) - acted ))
    cat "$sweep_out"
    return $rc
}
# inject_mid_sweep OUT PORT ERROR BENCH-ARG...: act_mid_sweep injecting ERROR
# on the root port PORT once the first row (1 MiB) is out; INJECTED_MS is
# ACTED_MS. An injection QEMU did not take fails the run (status 99), so that
# a check that something "goes unseen" cannot pass on nothing.
inject_mid_sweep() {
    out="$1"; port="$2"; error="$3"; shift 3
    act_mid_sweep "$out" 1048576 "inject $port $error" "$@" && rc=0 || rc=$?
    INJECTED_MS=$ACTED_MS
    return $rc
}
# every_rank_named OUT NRANKS PATTERN: the bench job in OUT failed on all
# NRANKS ranks, each error matching PATTERN, each rank's end said and none
# by a signal, and no row of its table has a wrong element.
every_rank_named() {
    [ "$(grep -c "$3" "$1")" = "$2" ] &&
        [ "$(grep -c "^pcieipc bench: rank [0-9]* exit status: [0-9]*$" "$1")" = "$2" ] &&
        ! grep -q "signal" "$1" &&
        awk '!/^#/ && NF == 14 && ($9 != 0 || $13 != 0) { bad++ } END { exit bad }' "$1"
}
# summary: prints the counts; fails if any check failed or none ran.
# port_of BDF: the bridge directly above BDF (the sysfs parent directory).
port_of() { basename "$(readlink -f "/sys/bus/pci/devices/$1/..")"; }
# cfg_byte BDF OFFSET / cfg_word BDF OFFSET: config space through sysfs (root
# reads all of it).
cfg_byte() { echo $(( 0x$(od -An -tx1 -j"$2" -N1 "/sys/bus/pci/devices/$1/config" | tr -d " ") )); }
cfg_word() { echo $(( 0x$(od -An -tx2 -j"$2" -N2 "/sys/bus/pci/devices/$1/config" | tr -d " ") )); }
# pcie_cap BDF: offset of the PCI Express capability (ID 0x10).
pcie_cap() {
    p=$(cfg_byte "$1" 52)
    while [ "$p" != 0 ]; do
        [ "$(cfg_byte "$1" "$p")" = 16 ] && { echo "$p"; return; }
        p=$(cfg_byte "$1" $((p + 1)))
    done
    return 1
}
# link_ctl BDF: "LnkCtl LnkCtl2" of a port.
link_ctl() { c=$(pcie_cap "$1") && echo "$(cfg_word "$1" $((c + 16))) $(cfg_word "$1" $((c + 48)))"; }
summary() {
    echo "guest: $PCIEIPC_PASSED passed, $PCIEIPC_FAILED failed"
    [ "$PCIEIPC_FAILED" = 0 ] && [ "$PCIEIPC_PASSED" -gt 0 ]
}
"#;

/// Writes the archive (uncompressed newc cpio) to `out`.
pub fn build(contents: &Contents<'_>, staging: &Path, out: &Path) -> Result<(), InitramfsError> {
    if !contents.guest_script.is_file() {
        return Err(InitramfsError::Input {
            path: contents.guest_script.to_path_buf(),
            message: "guest script not found".into(),
        });
    }
    let busybox = Path::new(BUSYBOX);
    if !busybox.is_file() {
        return Err(InitramfsError::Input {
            path: busybox.to_path_buf(),
            message: "busybox not found (install busybox-static: scripts/setup-host.sh)".into(),
        });
    }
    let _ = fs::remove_dir_all(staging);
    mkdir(&staging.join("testbed"))?;
    mkdir(&staging.join("lib/modules"))?;
    copy(busybox, &staging.join("bin/busybox"))?;
    write(&staging.join("init"), INIT, true)?;
    write(&staging.join("bin/host"), HOST, true)?;
    write(&staging.join("bin/inject"), INJECT, true)?;
    write(&staging.join("testbed/lib.sh"), LIB, false)?;
    copy(contents.guest_script, &staging.join("testbed/guest.sh"))?;
    write(
        &staging.join("testbed/topology.toml"),
        contents.topology_text,
        false,
    )?;
    let tree: String = contents
        .expected_tree
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    write(&staging.join("testbed/expected-tree.txt"), &tree, false)?;
    if let Some(module) = contents.module {
        copy(
            module,
            &staging.join("lib/modules").join(file_name(module)?),
        )?;
    }
    for binary in contents.binaries {
        let inside = staging.join("bin").join(file_name(binary)?);
        copy(binary, &inside)?;
        strip_debug(&inside)?;
        for library in shared_libraries(binary)? {
            let inside = staging.join(library.strip_prefix("/").unwrap_or(&library));
            if !inside.exists() {
                copy(&library, &inside)?;
            }
        }
    }
    let archive = fs::File::create(out).map_err(|source| InitramfsError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    // `find | cpio` from inside the staging tree: paths relative to its root.
    let status = Command::new("sh")
        .arg("-c")
        .arg("find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc")
        .current_dir(staging)
        .stdout(Stdio::from(archive))
        .status()
        .map_err(|e| InitramfsError::Archive(format!("cannot run find | cpio: {e}")))?;
    if !status.success() {
        return Err(InitramfsError::Archive(format!(
            "find | cpio exited with {status} (is cpio installed?)"
        )));
    }
    Ok(())
}

/// The shared libraries (and the dynamic loader) a binary needs, from ldd.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, InitramfsError> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|source| InitramfsError::Io {
            path: binary.to_path_buf(),
            source,
        })?;
    let text = String::from_utf8_lossy(&output.stdout);
    if text.contains("not a dynamic executable")
        || String::from_utf8_lossy(&output.stderr).contains("not a dynamic")
    {
        return Ok(Vec::new());
    }
    if !output.status.success() {
        return Err(InitramfsError::Input {
            path: binary.to_path_buf(),
            message: format!(
                "ldd failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    let mut libraries = Vec::new();
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let target = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = target.filter(|p| p.starts_with('/')) {
            libraries.push(PathBuf::from(path));
            // Keep the loader's canonical path too: /lib64 is a link on Debian.
            if let Ok(real) = fs::canonicalize(path) {
                if real != Path::new(path) {
                    libraries.push(real);
                }
            }
        } else if line.contains("not found") {
            return Err(InitramfsError::Input {
                path: binary.to_path_buf(),
                message: format!("a shared library is missing: {}", line.trim()),
            });
        }
    }
    Ok(libraries)
}

fn file_name(path: &Path) -> Result<&std::ffi::OsStr, InitramfsError> {
    path.file_name().ok_or_else(|| InitramfsError::Input {
        path: path.to_path_buf(),
        message: "not a file name".into(),
    })
}

fn mkdir(path: &Path) -> Result<(), InitramfsError> {
    fs::create_dir_all(path).map_err(|source| InitramfsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn copy(from: &Path, to: &Path) -> Result<(), InitramfsError> {
    if let Some(parent) = to.parent() {
        mkdir(parent)?;
    }
    fs::copy(from, to)
        .map(drop)
        .map_err(|source| InitramfsError::Io {
            path: from.to_path_buf(),
            source,
        })
}

/// Drops the debug information of the binary at `path` (the release
/// profile keeps it for perf and backtraces): the guest unpacks the archive
/// into its RAM, and with it the binaries would take about 300 MB of a
/// 512 MiB guest. Symbols stay, so a panic's backtrace still names its
/// functions.
fn strip_debug(path: &Path) -> Result<(), InitramfsError> {
    let output = std::process::Command::new("strip")
        .arg("--strip-debug")
        .arg(path)
        .output()
        .map_err(|source| InitramfsError::Io {
            path: PathBuf::from("strip (binutils)"),
            source,
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(InitramfsError::Input {
            path: path.to_path_buf(),
            message: format!(
                "strip --strip-debug failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        })
    }
}

fn write(path: &Path, text: &str, executable: bool) -> Result<(), InitramfsError> {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, text).map_err(|source| InitramfsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mode = if executable { 0o755 } else { 0o644 };
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(|source| {
        InitramfsError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}
