//! The header compiled by gcc (the compiler the kernel is built with) must
//! agree with the Rust bindings on every struct size, every field offset and
//! every ioctl number. The expected values are the ones bindgen pinned in
//! generated.rs's layout assertions (which the Rust compiler checks against
//! the Rust types), so every struct of the header is covered automatically.

use std::{path::PathBuf, process::Command};

const GENERATED: &str = include_str!("../src/generated.rs");

/// (C expression, value) pairs from the layout assertions and constants.
fn expected() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = GENERATED.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let line = line.trim();
        // `["Size of pcieipc_version"][::core::mem::size_of::<pcieipc_version>() - 48usize];`
        if let Some(rest) = line.strip_prefix("[\"Size of ") {
            let name = rest.split('"').next().unwrap();
            out.push((format!("sizeof(struct {name})"), number_before_usize(line)));
        }
        // `["Offset of field: pcieipc_version::argsz"]` then the offset on the next line.
        if let Some(rest) = line.strip_prefix("[\"Offset of field: ") {
            let path = rest.split('"').next().unwrap();
            let (st, field) = path.split_once("::").unwrap();
            let value_line = if line.contains("usize]") { line } else { lines[i + 1] };
            out.push((format!("offsetof(struct {st}, {field})"), number_before_usize(value_line)));
        }
        // `pub const PCIEIPC_IOC_VERSION: u32 = 55040;`
        if let Some(rest) = line.strip_prefix("pub const PCIEIPC_IOC_") {
            let (name, value) = rest.split_once(": u32 = ").unwrap();
            out.push((format!("PCIEIPC_IOC_{name}"), value.trim_end_matches(';').parse().unwrap()));
        }
    }
    out
}

fn number_before_usize(line: &str) -> u64 {
    let end = line.rfind("usize]").expect("a layout assertion");
    let start = line[..end].rfind(|c: char| !c.is_ascii_digit()).unwrap() + 1;
    line[start..end].parse().unwrap()
}

#[test]
fn gcc_agrees_with_every_layout_bindgen_pinned() {
    let expected = expected();
    assert!(expected.iter().any(|(e, _)| e == "sizeof(struct pcieipc_version)"));
    assert!(expected.iter().any(|(e, _)| e == "PCIEIPC_IOC_VERSION"));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::temp_dir().join(format!("pcieipc-uapi-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut program = String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"pcieipc.h\"\nint main(void) {\n");
    for (expr, _) in &expected {
        program += &format!("    printf(\"%lu\\n\", (unsigned long)({expr}));\n");
    }
    program += "    return 0;\n}\n";
    std::fs::write(dir.join("layout.c"), program).unwrap();
    let status = Command::new("cc")
        .arg("-I")
        .arg(root.join("include/uapi"))
        .arg(dir.join("layout.c"))
        .arg("-o")
        .arg(dir.join("layout"))
        .status()
        .expect("a C compiler (cc) is needed for this test");
    assert!(status.success(), "cc failed on include/uapi/pcieipc.h");
    let out = Command::new(dir.join("layout")).output().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let c_values: Vec<u64> = String::from_utf8(out.stdout).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(c_values.len(), expected.len());
    for ((expr, want), got) in expected.iter().zip(&c_values) {
        assert_eq!(got, want, "{expr}: gcc says {got}, the bindings {want}");
    }
}

#[test]
fn ioctl_numbers_follow_the_vfio_convention() {
    use pcieipc_uapi::*;
    // _IO(magic, nr): no direction, no size; the size travels in argsz.
    assert_eq!(PCIEIPC_IOC_VERSION, (PCIEIPC_IOC_MAGIC << 8) | PCIEIPC_CMD_VERSION);
    assert_eq!(PCIEIPC_IOC_LINK_STATUS, (PCIEIPC_IOC_MAGIC << 8) | PCIEIPC_CMD_LINK_STATUS);
}
