//! mmap of BAR windows: what the module maps and what it refuses.

use nix::errno::Errno;
use pcieipc::device::{Device, DeviceKind};

use super::common::{bound, open, shared_bar_size, CheckResult};

/// The errno of a mapping that should fail.
fn refused(device: &Device, index: u32, bar: u32, offset: u64, len: usize) -> Option<Errno> {
    match device.map_bar(index, bar, offset, len) {
        Ok(_) => None,
        Err(e) => e.errno(),
    }
}

/// `mmap-checks`: two ivshmem-doorbell devices of one region map BAR2 and
/// see each other's writes; bad windows are refused with the documented
/// errno.
pub fn run() -> CheckResult {
    let device = open()?;
    let pair = bound(&device, DeviceKind::Ivshmem)?;
    let [a, b] = pair.get(..2).ok_or("two ivshmem-doorbell devices needed")? else {
        unreachable!()
    };
    let size = shared_bar_size(a)?;
    let page = 4096usize;
    // Whole BAR on one device, its last page on the other: the same memory.
    let whole = device
        .map_bar(a.index, 2, 0, size)
        .map_err(|e| e.to_string())?;
    let last = device
        .map_bar(b.index, 2, (size - page) as u64, page)
        .map_err(|e| e.to_string())?;
    let pattern: Vec<u8> = (0..page).map(|i| (i * 13 + 5) as u8).collect();
    whole.write(size - page, &pattern);
    let mut seen = vec![0u8; page];
    last.read(0, &mut seen);
    if seen != pattern {
        return Err("a write through device A's window is not seen through device B's".into());
    }
    println!(
        "mmap: BAR2 of devices {} and {} share {size} bytes",
        a.index, b.index
    );
    let cases: [(&str, u32, u32, u64, usize, Errno); 8] = [
        (
            "window past the BAR's end",
            a.index,
            2,
            (size - page) as u64,
            2 * page,
            Errno::EINVAL,
        ),
        (
            "offset at the BAR's end",
            a.index,
            2,
            size as u64,
            page,
            Errno::EINVAL,
        ),
        (
            "register BAR0 (module-owned, below a page)",
            a.index,
            0,
            0,
            page,
            Errno::EINVAL,
        ),
        ("MSI-X BAR1", a.index, 1, 0, page, Errno::EINVAL),
        ("BAR 6", a.index, 6, 0, page, Errno::EINVAL),
        ("unaligned offset", a.index, 2, 100, page, Errno::EINVAL),
        ("unknown device index", 9999, 2, 0, page, Errno::ENOENT),
        (
            "offset past 1 TiB within a BAR slot",
            a.index,
            2,
            1 << 39,
            page,
            Errno::EINVAL,
        ),
    ];
    private_mapping_refused(a.index)?;
    for (what, index, bar, offset, len, expected) in cases {
        let got = refused(&device, index, bar, offset, len);
        println!("mmap: {what}: {got:?}");
        if got != Some(expected) {
            return Err(format!("{what}: expected {expected}, got {got:?}"));
        }
    }
    Ok(())
}

/// `mmap-gone`: the BAR2 window of a gone device is refused with ENODEV.
pub fn gone(index: u32) -> CheckResult {
    let device = open()?;
    let got = refused(&device, index, 2, 0, 4096);
    println!("mmap: BAR2 of gone device {index}: {got:?}");
    if got != Some(Errno::ENODEV) {
        return Err(format!("expected ENODEV, got {got:?}"));
    }
    Ok(())
}

/// A private (copy-on-write) mapping of a BAR window is refused: EINVAL.
fn private_mapping_refused(index: u32) -> CheckResult {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(pcieipc::device::DEFAULT_PATH)
        .map_err(|e| e.to_string())?;
    let len = std::num::NonZeroUsize::new(4096).ok_or("len")?;
    // SAFETY: a new mapping at an address the kernel picks (expected to fail).
    let result = unsafe {
        nix::sys::mman::mmap(
            None,
            len,
            nix::sys::mman::ProtFlags::PROT_READ,
            nix::sys::mman::MapFlags::MAP_PRIVATE,
            &file,
            pcieipc_uapi::mmap_offset(index, 2) as i64,
        )
    };
    let got = match result {
        Ok(ptr) => {
            // SAFETY: the mapping just made.
            unsafe { nix::sys::mman::munmap(ptr, 4096) }.map_err(|e| e.to_string())?;
            None
        }
        Err(errno) => Some(errno),
    };
    println!("mmap: a private mapping of BAR2: {got:?}");
    if got != Some(Errno::EINVAL) {
        return Err(format!("private mapping: expected EINVAL, got {got:?}"));
    }
    Ok(())
}

/// `mmap-touch`: maps BAR2 of device `index` and of `witness` (a device of
/// the same region), writes a byte through the first and sees it through
/// the second, creates `ready`, waits for `go` to exist (the device is
/// unbound in between), then reads and writes the first window again. The
/// module maps its stand-in page there: no signal, and the write must not
/// reach the region, which the witness still reads as before.
pub fn touch(
    index: u32,
    witness: u32,
    ready: &std::path::Path,
    go: &std::path::Path,
) -> CheckResult {
    let device = open()?;
    let window = device
        .map_bar(index, 2, 0, 4096)
        .map_err(|e| e.to_string())?;
    let seen = device
        .map_bar(witness, 2, 0, 4096)
        .map_err(|e| e.to_string())?;
    let read = |window: &pcieipc::device::MappedWindow| {
        let mut byte = [0u8; 1];
        window.read(0, &mut byte);
        byte[0]
    };
    window.write(0, &[0x5a]);
    if read(&seen) != 0x5a {
        return Err(format!(
            "device {witness} reads {:#x}, not the 0x5a written through device {index}",
            read(&seen)
        ));
    }
    std::fs::write(ready, b"mapped\n").map_err(|e| e.to_string())?;
    while !go.exists() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let after = read(&window);
    window.write(0, &[0xa7]);
    println!(
        "mmap-touch: after the go signal device {index}'s window read {after:#x}, then took 0xa7; \
         device {witness} reads {:#x}",
        read(&seen)
    );
    if read(&seen) != 0x5a {
        return Err("the write through the unbound device's window reached the region".into());
    }
    Ok(())
}
