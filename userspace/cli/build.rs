//! Records the commit the CLI is built from (`pcieipc --version`): `git
//! describe --always --dirty` of the checkout, or `PCIEIPC_COMMIT` where the
//! sources come without git (a packaged tarball), or "unknown".

use std::process::Command;

fn main() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    // A new commit moves HEAD (or the branch it names) and rewrites the index.
    for path in [".git/HEAD", ".git/index"] {
        println!("cargo:rerun-if-changed={root}/{path}");
    }
    println!("cargo:rerun-if-env-changed=PCIEIPC_COMMIT");
    let commit = std::env::var("PCIEIPC_COMMIT").ok().or_else(|| {
        let output = Command::new("git")
            .args(["-C", root, "describe", "--always", "--dirty", "--abbrev=12"])
            .output()
            .ok()?;
        let text = String::from_utf8(output.stdout).ok()?;
        (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
    });
    println!(
        "cargo:rustc-env=PCIEIPC_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
}
