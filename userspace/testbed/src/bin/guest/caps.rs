//! Privileges: /dev/pcieipc opens for root only, and a process that holds
//! an open file but lost CAP_SYS_ADMIN cannot touch hardware through it,
//! nor map a DMA buffer it allocated while privileged.

use std::time::Duration;

use nix::errno::Errno;
use pcieipc::device::{Device, DeviceKind, WaitResult, DEFAULT_PATH};

use super::common::{bound, open, CheckResult};

/// `caps-check`: opens as root, drops to uid 65534 (which clears every
/// capability), then checks what the module still answers.
pub fn run() -> CheckResult {
    let device = open()?;
    let ivshmem = bound(&device, DeviceKind::Ivshmem)?
        .into_iter()
        .next()
        .ok_or("no ivshmem-doorbell device bound")?;
    // Allocated while privileged: the mmap below must still be refused.
    let buffer = device
        .dma_alloc(ivshmem.index, 4096)
        .map_err(|e| e.to_string())?;
    // SAFETY: setuid only changes this process's credentials (nix's
    // wrapper needs a feature the workspace does not enable).
    if unsafe { nix::libc::setuid(65534) } != 0 {
        return Err(format!("setuid: {}", Errno::last()));
    }
    let reopen = Device::open(DEFAULT_PATH).err().and_then(|e| match e {
        pcieipc::device::DeviceError::Open { source, .. } => source.raw_os_error(),
        _ => None,
    });
    println!("caps: open as uid 65534: {:?}", reopen.map(Errno::from_raw));
    if reopen != Some(Errno::EACCES as i32) {
        return Err(format!(
            "open without root: expected EACCES, got {reopen:?}"
        ));
    }
    let listed = device.list().map_err(|e| e.to_string())?.len();
    let wait = device
        .wait(ivshmem.index, 0, u64::MAX - 1, Some(Duration::ZERO))
        .map_err(|e| e.to_string())?;
    println!("caps: without CAP_SYS_ADMIN, LIST gives {listed} devices, WAIT gives {wait:?}");
    if listed == 0 || wait != WaitResult::TimedOut {
        return Err("LIST and WAIT must still answer without CAP_SYS_ADMIN".into());
    }
    let refused = [
        (
            "RING",
            device
                .ring(ivshmem.index, 0, 0)
                .err()
                .and_then(|e| e.errno()),
        ),
        (
            "mmap of BAR2",
            device
                .map_bar(ivshmem.index, 2, 0, 4096)
                .err()
                .and_then(|e| e.errno()),
        ),
        (
            "mmap of a DMA buffer",
            device.map_dma(&buffer).err().and_then(|e| e.errno()),
        ),
        (
            "DMA_ALLOC",
            device
                .dma_alloc(ivshmem.index, 4096)
                .err()
                .and_then(|e| e.errno()),
        ),
    ];
    for (what, got) in refused {
        println!("caps: {what} without CAP_SYS_ADMIN: {got:?}");
        if got != Some(Errno::EPERM) {
            return Err(format!("{what}: expected EPERM, got {got:?}"));
        }
    }
    Ok(())
}
