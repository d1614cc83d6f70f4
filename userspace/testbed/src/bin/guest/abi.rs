//! The argsz protocol: a binary built against an older, smaller struct
//! keeps working when the struct grows.

use std::os::fd::{AsFd, AsRawFd};

use nix::errno::Errno;
use pcieipc_uapi as uapi;

use super::common::{open, CheckResult};

/// `PCIEIPC_IOC_VERSION` on a 64-byte buffer filled with 0xAA whose first
/// word is `argsz`: the errno, and the buffer as the module left it.
fn version_with_argsz(fd: i32, argsz: u32) -> (Result<(), Errno>, [u8; 64]) {
    #[repr(C, align(8))]
    struct Buffer([u8; 64]);
    let mut buffer = Buffer([0xaa; 64]);
    buffer.0[..4].copy_from_slice(&argsz.to_ne_bytes());
    buffer.0[4..8].fill(0); // flags
                            // SAFETY: the module reads and writes at most min(argsz, its struct's
                            // size) bytes, and argsz <= 64 here.
    let rc = unsafe { nix::libc::ioctl(fd, uapi::PCIEIPC_IOC_VERSION as _, buffer.0.as_mut_ptr()) };
    (Errno::result(rc).map(drop), buffer.0)
}

/// `argsz-old`: VERSION as an ABI 0.3 binary calls it (argsz 48, the size
/// of the struct's first version) succeeds and leaves the bytes past 48
/// alone; 47 is refused with EINVAL; the current size gets the new field.
pub fn old_struct() -> CheckResult {
    let device = open()?;
    let fd = device.as_fd().as_raw_fd();
    let (old, bytes) = version_with_argsz(fd, 48);
    let major = u16::from_ne_bytes([bytes[8], bytes[9]]);
    let minor = u16::from_ne_bytes([bytes[10], bytes[11]]);
    println!(
        "abi: VERSION with argsz 48 (ABI 0.3's struct): {old:?}, ABI {major}.{minor}, bytes 48..64 {:02x?}",
        &bytes[48..]
    );
    if old != Ok(()) || major != uapi::PCIEIPC_ABI_MAJOR as u16 {
        return Err(format!("argsz 48 must be accepted, got {old:?}"));
    }
    if bytes[48..].iter().any(|&b| b != 0xaa) {
        return Err("the module wrote past the caller's argsz".into());
    }
    let (short, _) = version_with_argsz(fd, 47);
    println!("abi: VERSION with argsz 47: {short:?}");
    if short != Err(Errno::EINVAL) {
        return Err(format!(
            "argsz 47 must be refused with EINVAL, got {short:?}"
        ));
    }
    let current = size_of::<uapi::pcieipc_version>() as u32;
    let (now, bytes) = version_with_argsz(fd, current);
    let emitted = u64::from_ne_bytes(bytes[48..56].try_into().expect("8 bytes"));
    println!("abi: VERSION with argsz {current}: {now:?}, events_emitted {emitted}");
    if now != Ok(()) || bytes[56..].iter().any(|&b| b != 0xaa) {
        return Err(format!("argsz {current}: {now:?}, or a write past it"));
    }
    let expected = device.version().map_err(|e| e.to_string())?.events_emitted;
    if emitted != expected {
        return Err(format!("events_emitted {emitted}, VERSION says {expected}"));
    }
    Ok(())
}
