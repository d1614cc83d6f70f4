//! The header compiled by the C compiler must agree with the Rust bindings on
//! every struct's size and every field's offset, and on the ioctl numbers.
//! (bindgen's own layout assertions check Rust against clang; this checks
//! against gcc, the compiler the kernel is built with.)

use std::{mem::offset_of, path::PathBuf, process::Command};

use pcieipc_uapi::*;

/// Every struct of the header with its fields, checked on both sides.
macro_rules! layouts {
    ($($t:ident { $($f:ident),* $(,)? })*) => {{
        let mut rust: Vec<(String, u64)> = Vec::new();
        let mut c = String::new();
        $(
            rust.push((format!("sizeof {}", stringify!($t)), size_of::<$t>() as u64));
            c.push_str(&format!("SIZE({})\n", stringify!($t)));
            $(
                rust.push((
                    format!("offset {}.{}", stringify!($t), stringify!($f)),
                    offset_of!($t, $f) as u64,
                ));
                c.push_str(&format!("OFF({}, {})\n", stringify!($t), stringify!($f)));
            )*
        )*
        (rust, c)
    }};
}

/// Constants checked on both sides.
const CONSTANTS: &[(&str, u64)] = &[
    ("PCIEIPC_IOC_VERSION", PCIEIPC_IOC_VERSION as u64),
    ("PCIEIPC_IOC_LIST", PCIEIPC_IOC_LIST as u64),
    ("PCIEIPC_IOC_WAIT", PCIEIPC_IOC_WAIT as u64),
    ("PCIEIPC_IOC_COUNTERS", PCIEIPC_IOC_COUNTERS as u64),
    ("PCIEIPC_IOC_RING", PCIEIPC_IOC_RING as u64),
    ("PCIEIPC_IOC_DMA_ALLOC", PCIEIPC_IOC_DMA_ALLOC as u64),
    ("PCIEIPC_IOC_DMA_COPY", PCIEIPC_IOC_DMA_COPY as u64),
    ("PCIEIPC_IOC_DMA_WAIT", PCIEIPC_IOC_DMA_WAIT as u64),
    ("PCIEIPC_MMAP_DMA", PCIEIPC_MMAP_DMA),
    ("PCIEIPC_DMA_SRC_BAR", PCIEIPC_DMA_SRC_BAR as u64),
    ("PCIEIPC_DMA_DST_BAR", PCIEIPC_DMA_DST_BAR as u64),
    ("PCIEIPC_DMA_BAR_MAX_SIZE", PCIEIPC_DMA_BAR_MAX_SIZE as u64),
    ("PCIEIPC_DMA_MAX_SIZE", PCIEIPC_DMA_MAX_SIZE as u64),
    ("PCIEIPC_MAX_VECTORS", PCIEIPC_MAX_VECTORS as u64),
    ("PCIEIPC_NUM_BARS", PCIEIPC_NUM_BARS as u64),
    ("PCIEIPC_WAIT_FOREVER", PCIEIPC_WAIT_FOREVER as u64),
    ("PCIEIPC_ABI_MAJOR", PCIEIPC_ABI_MAJOR as u64),
    ("PCIEIPC_ABI_MINOR", PCIEIPC_ABI_MINOR as u64),
    ("PCIEIPC_MMAP_OFFSET(3, 2)", mmap_offset(3, 2)),
];

fn layouts() -> (Vec<(String, u64)>, String) {
    layouts! {
        pcieipc_version { argsz, flags, abi_major, abi_minor, bound_devices, module_version }
        pcieipc_bar_info { size, mmap_offset, flags, reserved }
        pcieipc_device_info {
            index, state, bdf, upstream_bdf, vendor, device, class_code, kind, irq_type,
            num_vectors, link_speed, link_width, peer_id, reserved, bars
        }
        pcieipc_list { argsz, flags, entry_size, capacity, count, reserved, entries }
        pcieipc_wait { argsz, flags, device, vector, last_seen, timeout_ms, reserved, count }
        pcieipc_counters { argsz, flags, device, num_vectors, counts }
        pcieipc_ring { argsz, flags, device, peer, vector }
        pcieipc_dma_alloc { argsz, flags, device, buffer, size, bus_addr, mmap_offset }
        pcieipc_dma_copy {
            argsz, flags, device, src_buffer, dst_buffer, engine, src_offset, dst_offset, length,
            ticket
        }
        pcieipc_dma_wait { argsz, flags, ticket, timeout_ms, reserved }
    }
}

fn c_values(layout_lines: &str) -> Vec<(String, u64)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempdir();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    let constants: String = CONSTANTS.iter().map(|(name, _)| format!("NUM({name})\n")).collect();
    std::fs::write(
        &src,
        format!(
            r#"
#include <stdio.h>
#include <stddef.h>
#include "pcieipc.h"
#define SIZE(t) printf("sizeof %s %zu\n", #t, sizeof(struct t));
#define OFF(t, f) printf("offset %s.%s %zu\n", #t, #f, offsetof(struct t, f));
#define NUM(n) printf("const %s %llu\n", #n, (unsigned long long)(n));
int main(void) {{
{layout_lines}{constants}    return 0;
}}
"#
        ),
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
    let (mut rust, layout_lines) = layouts();
    rust.extend(CONSTANTS.iter().map(|(name, value)| (format!("const {name}"), *value)));
    assert_eq!(c_values(&layout_lines), rust);
}

#[test]
fn ioctl_numbers_follow_the_vfio_convention() {
    // _IO(magic, nr): no direction, no size; the size travels in argsz.
    assert_eq!(PCIEIPC_IOC_VERSION, (PCIEIPC_IOC_MAGIC << 8) | PCIEIPC_CMD_VERSION);
    assert_eq!(PCIEIPC_IOC_LIST, (PCIEIPC_IOC_MAGIC << 8) | PCIEIPC_CMD_LIST);
    assert_eq!(PCIEIPC_IOC_WAIT, (PCIEIPC_IOC_MAGIC << 8) | PCIEIPC_CMD_WAIT);
    assert_eq!(PCIEIPC_IOC_COUNTERS, (PCIEIPC_IOC_MAGIC << 8) | PCIEIPC_CMD_COUNTERS);
    assert_eq!(PCIEIPC_IOC_RING, (PCIEIPC_IOC_MAGIC << 8) | PCIEIPC_CMD_RING);
    assert_eq!(PCIEIPC_IOC_DMA_ALLOC, (PCIEIPC_IOC_MAGIC << 8) | PCIEIPC_CMD_DMA_ALLOC);
    assert_eq!(PCIEIPC_IOC_DMA_COPY, (PCIEIPC_IOC_MAGIC << 8) | PCIEIPC_CMD_DMA_COPY);
    assert_eq!(PCIEIPC_IOC_DMA_WAIT, (PCIEIPC_IOC_MAGIC << 8) | PCIEIPC_CMD_DMA_WAIT);
}

#[test]
fn abi_structs_have_no_implicit_padding() {
    // The kernel copies these structs byte for byte (FromBytes/AsBytes):
    // their fields must cover every byte.
    assert_eq!(size_of::<pcieipc_bar_info>(), 8 + 8 + 4 + 4);
    assert_eq!(size_of::<pcieipc_device_info>(), 12 * 4 + 6 * size_of::<pcieipc_bar_info>());
    assert_eq!(size_of::<pcieipc_list>(), 6 * 4 + 8);
    assert_eq!(size_of::<pcieipc_wait>(), 4 * 4 + 8 + 2 * 4 + 8);
    assert_eq!(size_of::<pcieipc_counters>(), 4 * 4 + 8 * PCIEIPC_MAX_VECTORS as usize);
    assert_eq!(size_of::<pcieipc_ring>(), 3 * 4 + 2 * 2);
    assert_eq!(size_of::<pcieipc_dma_alloc>(), 4 * 4 + 3 * 8);
    assert_eq!(size_of::<pcieipc_dma_copy>(), 6 * 4 + 4 * 8);
    assert_eq!(size_of::<pcieipc_dma_wait>(), 2 * 4 + 8 + 2 * 4);
}
