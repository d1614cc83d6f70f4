//! `pcieipc --version` names this build's version, a commit of this
//! repository, the ABI of `include/uapi/pcieipc.h`, and what it found at
//! /dev/pcieipc.

use std::path::Path;
use std::process::Command;

/// `PCIEIPC_ABI_MAJOR`.`PCIEIPC_ABI_MINOR` as the header defines them.
fn header_abi() -> String {
    let header = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../include/uapi/pcieipc.h"
    ))
    .unwrap();
    let define = |name: &str| {
        header
            .lines()
            .find_map(|line| line.strip_prefix(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("{name} not in the header"))
            .trim()
            .to_owned()
    };
    format!(
        "{}.{}",
        define("PCIEIPC_ABI_MAJOR"),
        define("PCIEIPC_ABI_MINOR")
    )
}

#[test]
fn version_names_the_build_its_commit_the_abi_and_the_module() {
    for flag in ["--version", "-V"] {
        let output = Command::new(env!("CARGO_BIN_EXE_pcieipc"))
            .arg(flag)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let text = String::from_utf8(output.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let prefix = format!("pcieipc {} (commit ", env!("CARGO_PKG_VERSION"));
        let commit = lines[0]
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(')'))
            .unwrap_or_else(|| panic!("{text}"));
        // A commit of this repository (the checkout may be dirty).
        let hash = commit.trim_end_matches("-dirty");
        let known = Command::new("git")
            .args(["-C", env!("CARGO_MANIFEST_DIR"), "cat-file", "-e"])
            .arg(format!("{hash}^{{commit}}"))
            .status()
            .unwrap();
        assert!(known.success(), "{commit} is no commit here");
        let abi = format!("ABI {}; ", header_abi());
        let module = lines[1]
            .strip_prefix(&abi)
            .unwrap_or_else(|| panic!("{text}"));
        if Path::new("/dev/pcieipc").exists() {
            assert!(module.contains("module"), "{text}");
        } else {
            assert_eq!(module, "no module loaded (/dev/pcieipc absent)");
        }
    }
}
