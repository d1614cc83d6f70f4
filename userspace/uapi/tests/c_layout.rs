//! The header compiled by the C compiler must agree with the Rust bindings on
//! every struct's size and every field's offset, and on the ioctl numbers.
//! (bindgen's own layout assertions check Rust against clang; this checks
//! against gcc, the compiler the kernel is built with.)

use std::{mem::offset_of, path::PathBuf, process::Command};

use pcieipc_uapi::*;

fn c_values() -> Vec<(String, u64)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempdir();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(
        &src,
        r#"
#include <stdio.h>
#include <stddef.h>
#include "pcieipc.h"
#define SIZE(t) printf("sizeof %s %zu\n", #t, sizeof(struct t));
#define OFF(t, f) printf("offset %s.%s %zu\n", #t, #f, offsetof(struct t, f));
#define NUM(n) printf("const %s %lu\n", #n, (unsigned long)(n));
int main(void) {
    SIZE(pcieipc_version)
    OFF(pcieipc_version, argsz) OFF(pcieipc_version, flags)
    OFF(pcieipc_version, abi_major) OFF(pcieipc_version, abi_minor)
    OFF(pcieipc_version, bound_devices) OFF(pcieipc_version, module_version)
    NUM(PCIEIPC_IOC_VERSION) NUM(PCIEIPC_ABI_MAJOR) NUM(PCIEIPC_ABI_MINOR)
    return 0;
}
"#,
    )
    .unwrap();
    let status = Command::new("cc")
        .arg("-I")
        .arg(root.join("include/uapi"))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("a C compiler (cc) is needed for this test");
    assert!(status.success(), "cc failed on include/uapi/pcieipc.h");
    let out = Command::new(&exe).output().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (name, value) = line.rsplit_once(' ').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pcieipc-uapi-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn rust_bindings_match_the_c_header() {
    let rust: Vec<(String, u64)> = vec![
        ("sizeof pcieipc_version".into(), size_of::<pcieipc_version>() as u64),
        ("offset pcieipc_version.argsz".into(), offset_of!(pcieipc_version, argsz) as u64),
        ("offset pcieipc_version.flags".into(), offset_of!(pcieipc_version, flags) as u64),
        ("offset pcieipc_version.abi_major".into(), offset_of!(pcieipc_version, abi_major) as u64),
        ("offset pcieipc_version.abi_minor".into(), offset_of!(pcieipc_version, abi_minor) as u64),
        (
            "offset pcieipc_version.bound_devices".into(),
            offset_of!(pcieipc_version, bound_devices) as u64,
        ),
        (
            "offset pcieipc_version.module_version".into(),
            offset_of!(pcieipc_version, module_version) as u64,
        ),
        ("const PCIEIPC_IOC_VERSION".into(), PCIEIPC_IOC_VERSION as u64),
        ("const PCIEIPC_ABI_MAJOR".into(), PCIEIPC_ABI_MAJOR as u64),
        ("const PCIEIPC_ABI_MINOR".into(), PCIEIPC_ABI_MINOR as u64),
    ];
    assert_eq!(c_values(), rust);
}

#[test]
fn ioctl_numbers_follow_the_vfio_convention() {
    // _IO(magic, nr): no direction, no size; the size travels in argsz.
    assert_eq!(PCIEIPC_IOC_VERSION, (PCIEIPC_IOC_MAGIC << 8) | PCIEIPC_CMD_VERSION);
}
