//! Bad input to the harness gives a clear error naming the problem, exit
//! status 2, and starts no VM.

use std::{
    ops::Deref,
    path::{Path, PathBuf},
    process::Command,
};

/// A test's scratch directory, removed when the test ends (passed or not).
struct Workdir(PathBuf);

impl Deref for Workdir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn workdir(name: &str) -> Workdir {
    let dir =
        std::env::temp_dir().join(format!("pcieipc-testbed-bad-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    Workdir(dir)
}

/// Runs `pcieipc-testbed run` with a kernel file that exists (never booted:
/// every case fails before QEMU starts) and returns (status, stderr).
fn run(dir: &Path, topology: &str, guest: &str) -> (i32, String) {
    let kernel = dir.join("bzImage");
    std::fs::write(&kernel, b"not booted").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pcieipc-testbed"))
        .args([
            "run",
            "--quiet",
            "--qemu",
            "/nonexistent/qemu",
            "--topology",
        ])
        .arg(dir.join(topology))
        .arg("--guest")
        .arg(dir.join(guest))
        .arg("--kernel")
        .arg(&kernel)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const GOOD: &str =
    "[[root_port]]\nid = \"rp1\"\n[[endpoint]]\nid = \"e\"\nkind = \"edu\"\nparent = \"rp1\"\n";

#[test]
fn missing_topology_file() {
    let dir = workdir("missing-topology");
    std::fs::write(dir.join("guest.sh"), "true\n").unwrap();
    let (status, err) = run(&dir, "nope.toml", "guest.sh");
    assert_eq!(status, 2);
    assert!(
        err.contains("nope.toml: cannot read the topology file"),
        "{err}"
    );
}

#[test]
fn malformed_topology_file() {
    let dir = workdir("malformed");
    std::fs::write(dir.join("t.toml"), "[[root_port]\nid = ").unwrap();
    std::fs::write(dir.join("guest.sh"), "true\n").unwrap();
    let (status, err) = run(&dir, "t.toml", "guest.sh");
    assert_eq!(status, 2);
    assert!(err.contains("t.toml: malformed topology file"), "{err}");
}

#[test]
fn unknown_device_kind() {
    let dir = workdir("kind");
    std::fs::write(dir.join("t.toml"), GOOD.replace("\"edu\"", "\"nvme\"")).unwrap();
    std::fs::write(dir.join("guest.sh"), "true\n").unwrap();
    let (status, err) = run(&dir, "t.toml", "guest.sh");
    assert_eq!(status, 2);
    assert!(err.contains("unknown variant `nvme`"), "{err}");
    assert!(
        err.contains("ivshmem-doorbell") && err.contains("pci-testdev"),
        "lists the known kinds: {err}"
    );
}

#[test]
fn missing_guest_script() {
    let dir = workdir("guest");
    std::fs::write(dir.join("t.toml"), GOOD).unwrap();
    let (status, err) = run(&dir, "t.toml", "absent.sh");
    assert_eq!(status, 2);
    assert!(err.contains("absent.sh: guest script not found"), "{err}");
}

#[test]
fn missing_qemu_binary() {
    let dir = workdir("qemu");
    std::fs::write(dir.join("t.toml"), GOOD).unwrap();
    std::fs::write(dir.join("guest.sh"), "true\n").unwrap();
    let (status, err) = run(&dir, "t.toml", "guest.sh");
    assert_eq!(status, 2);
    assert!(
        err.contains("QEMU (/nonexistent/qemu) could not start"),
        "{err}"
    );
}
