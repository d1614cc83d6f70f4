//! The header compiled by gcc (the compiler the kernel is built with) must
//! agree with the Rust bindings on every struct size, every field offset and
//! every ioctl number, and no struct may have implicit padding (the module
//! copies them byte for byte). The expected values are the ones bindgen
//! pinned in generated.rs's layout assertions, which the Rust compiler
//! checks against the Rust types, so every struct of the header is covered
//! without a list to keep up to date.

use std::{collections::BTreeMap, path::PathBuf, process::Command};

use pcieipc_uapi::*;

const GENERATED: &str = include_str!("../src/generated.rs");

struct Layout {
    sizes: BTreeMap<String, u64>,
    /// struct -> [(field, offset)] in declaration order.
    fields: BTreeMap<String, Vec<(String, u64)>>,
    ioctls: Vec<(String, u64)>,
}

fn number_before_usize(line: &str) -> u64 {
    let end = line.rfind("usize]").expect("a layout assertion");
    let start = line[..end].rfind(|c: char| !c.is_ascii_digit()).unwrap() + 1;
    line[start..end].parse().unwrap()
}

fn generated_layout() -> Layout {
    let mut layout = Layout {
        sizes: BTreeMap::new(),
        fields: BTreeMap::new(),
        ioctls: Vec::new(),
    };
    let lines: Vec<&str> = GENERATED.lines().map(str::trim).collect();
    for (i, line) in lines.iter().enumerate() {
        // ["Size of pcieipc_version"][::core::mem::size_of::<pcieipc_version>() - 48usize];
        if let Some(rest) = line.strip_prefix("[\"Size of ") {
            layout.sizes.insert(
                rest.split('"').next().unwrap().into(),
                number_before_usize(line),
            );
        }
        // ["Offset of field: pcieipc_version::argsz"] and the offset, on this line or the next.
        if let Some(rest) = line.strip_prefix("[\"Offset of field: ") {
            let (name, field) = rest.split('"').next().unwrap().split_once("::").unwrap();
            let value_line = if line.contains("usize]") {
                line
            } else {
                lines[i + 1]
            };
            layout
                .fields
                .entry(name.into())
                .or_default()
                .push((field.into(), number_before_usize(value_line)));
        }
        // pub const PCIEIPC_IOC_VERSION: u32 = 55040;
        if let Some(rest) = line.strip_prefix("pub const PCIEIPC_IOC_") {
            if let Some((name, value)) = rest.split_once(": u32 = ") {
                layout.ioctls.push((
                    format!("PCIEIPC_IOC_{name}"),
                    value.trim_end_matches(';').parse().unwrap(),
                ));
            }
        }
    }
    layout
}

/// Evaluates C expressions against the header with gcc.
fn gcc_values(expressions: &[String]) -> Vec<u64> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::temp_dir().join(format!("pcieipc-uapi-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut program = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"pcieipc.h\"\nint main(void) {\n",
    );
    for expr in expressions {
        program += &format!("    printf(\"%llu\\n\", (unsigned long long)({expr}));\n");
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
    let values: Vec<u64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(values.len(), expressions.len());
    values
}

#[test]
fn gcc_agrees_with_the_bindings_and_no_struct_has_padding() {
    let layout = generated_layout();
    assert!(
        layout.sizes.contains_key("pcieipc_version") && layout.sizes.contains_key("pcieipc_event")
    );
    assert!(layout
        .ioctls
        .iter()
        .any(|(n, _)| n == "PCIEIPC_IOC_VERSION"));
    let mut expressions = Vec::new();
    let mut expected = Vec::new();
    for (name, size) in &layout.sizes {
        expressions.push(format!("sizeof(struct {name})"));
        expected.push(*size);
        for (field, offset) in &layout.fields[name] {
            expressions.push(format!("offsetof(struct {name}, {field})"));
            expected.push(*offset);
        }
    }
    for (name, value) in &layout.ioctls {
        expressions.push(name.clone());
        expected.push(*value);
    }
    for (expr, value) in [
        ("PCIEIPC_MMAP_OFFSET(3, 2)", mmap_offset(3, 2)),
        ("PCIEIPC_ABI_MAJOR", PCIEIPC_ABI_MAJOR as u64),
        ("PCIEIPC_ABI_MINOR", PCIEIPC_ABI_MINOR as u64),
        ("PCIEIPC_MMAP_DMA", PCIEIPC_MMAP_DMA),
        ("PCIEIPC_DMA_SRC_BAR", PCIEIPC_DMA_SRC_BAR as u64),
        ("PCIEIPC_DMA_DST_BAR", PCIEIPC_DMA_DST_BAR as u64),
        ("PCIEIPC_DMA_BAR_MAX_SIZE", PCIEIPC_DMA_BAR_MAX_SIZE as u64),
        ("PCIEIPC_DMA_MAX_SIZE", PCIEIPC_DMA_MAX_SIZE as u64),
        ("PCIEIPC_MAX_VECTORS", PCIEIPC_MAX_VECTORS as u64),
        ("PCIEIPC_NUM_BARS", PCIEIPC_NUM_BARS as u64),
        ("PCIEIPC_WAIT_FOREVER", PCIEIPC_WAIT_FOREVER as u64),
        (
            "PCIEIPC_EVENT_RING_CAPACITY",
            PCIEIPC_EVENT_RING_CAPACITY as u64,
        ),
        ("PCIEIPC_BDF_NONE", PCIEIPC_BDF_NONE as u64),
        ("PCIEIPC_BDF(1, 0x3b, 9)", 0x0001_3b09),
    ] {
        expressions.push(expr.into());
        expected.push(value);
    }
    // Field sizes, for the padding check.
    let field_sizes_at = expressions.len();
    for (name, fields) in &layout.fields {
        for (field, _) in fields {
            expressions.push(format!("sizeof(((struct {name} *)0)->{field})"));
        }
    }
    let values = gcc_values(&expressions);
    for ((expr, want), got) in expressions.iter().zip(&expected).zip(&values) {
        assert_eq!(got, want, "{expr}: gcc says {got}, the bindings {want}");
    }
    let mut field_sizes = values[field_sizes_at..].iter();
    for (name, fields) in &layout.fields {
        let mut end = 0;
        for (field, offset) in fields {
            assert_eq!(
                *offset, end,
                "struct {name}: implicit padding before {field}"
            );
            end = offset + field_sizes.next().unwrap();
        }
        assert_eq!(
            end, layout.sizes[name],
            "struct {name}: implicit padding at the end"
        );
    }
}

#[test]
fn ioctl_numbers_follow_the_vfio_convention() {
    // _IO(magic, nr): no direction, no size; the size travels in argsz.
    for (ioctl, cmd) in [
        (PCIEIPC_IOC_VERSION, PCIEIPC_CMD_VERSION),
        (PCIEIPC_IOC_LIST, PCIEIPC_CMD_LIST),
        (PCIEIPC_IOC_WAIT, PCIEIPC_CMD_WAIT),
        (PCIEIPC_IOC_COUNTERS, PCIEIPC_CMD_COUNTERS),
        (PCIEIPC_IOC_RING, PCIEIPC_CMD_RING),
        (PCIEIPC_IOC_DMA_ALLOC, PCIEIPC_CMD_DMA_ALLOC),
        (PCIEIPC_IOC_DMA_COPY, PCIEIPC_CMD_DMA_COPY),
        (PCIEIPC_IOC_DMA_WAIT, PCIEIPC_CMD_DMA_WAIT),
        (PCIEIPC_IOC_LINK_STATUS, PCIEIPC_CMD_LINK_STATUS),
        (PCIEIPC_IOC_LINK_RETRAIN, PCIEIPC_CMD_LINK_RETRAIN),
        (PCIEIPC_IOC_WATCH, PCIEIPC_CMD_WATCH),
        (PCIEIPC_IOC_RESET, PCIEIPC_CMD_RESET),
    ] {
        assert_eq!(ioctl, (PCIEIPC_IOC_MAGIC << 8) | cmd);
    }
}
