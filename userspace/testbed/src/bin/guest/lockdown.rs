//! Kernel lockdown: the module's raw PCI access (BAR mmap, CPU copies
//! between a DMA buffer and a BAR) works while the kernel is not locked down
//! and is refused with EPERM once it is, as sysfs `config`/`resourceN` are;
//! DMA buffers (allocation, mmap, buffer-to-buffer copies) are not raw PCI
//! access and keep working.

use std::time::Duration;

use nix::errno::Errno;
use pcieipc::device::{Device, DeviceError, DeviceKind, DmaTicket, DmaWaitResult};

use super::common::{bound, open, CheckResult};

/// `raw-pci --expect allowed|refused`, on the first bound ivshmem device.
pub fn run(expect: &str) -> CheckResult {
    let allowed = match expect {
        "allowed" => true,
        "refused" => false,
        _ => return Err(format!("--expect: allowed or refused, not {expect:?}")),
    };
    let device = open()?;
    let ivshmem = bound(&device, DeviceKind::Ivshmem)?
        .into_iter()
        .next()
        .ok_or("no ivshmem-doorbell device bound")?;
    let index = ivshmem.index;
    let text = |e: DeviceError| e.to_string();

    // Not raw PCI access: allowed either way.
    let src = device.dma_alloc(index, 4096).map_err(text)?;
    let dst = device.dma_alloc(index, 4096).map_err(text)?;
    let src_map = device.map_dma(&src).map_err(text)?;
    let dst_map = device.map_dma(&dst).map_err(text)?;
    let pattern: Vec<u8> = (0..11u8).map(|i| 0x5a ^ (i * 29)).collect();
    src_map.write(3, &pattern);
    let ticket = device.dma_copy((&src, 3), (&dst, 5), 11).map_err(text)?;
    done(&device, &ticket)?;
    let mut got = [0u8; 11];
    dst_map.read(5, &mut got);
    if got[..] != pattern[..] {
        return Err("buffer-to-buffer copy: wrong bytes".into());
    }
    println!("raw-pci: DMA_ALLOC, mmap of a DMA buffer and a buffer-to-buffer copy (11 B, verified): allowed");

    // Raw PCI access.
    let window = device.map_bar(index, 2, 0, 4096);
    let to_bar = device.dma_copy_to_bar(&src, 3, 2, 4093, 3);
    if allowed {
        let window = window.map_err(text)?;
        done(&device, &to_bar.map_err(text)?)?;
        let from_bar = device.dma_copy_from_bar(2, 4093, &dst, 0, 3);
        done(&device, &from_bar.map_err(text)?)?;
        let mut seen = [0u8; 3];
        window.read(4093, &mut seen);
        let mut back = [0u8; 3];
        dst_map.read(0, &mut back);
        if seen[..] != pattern[..3] || back[..] != pattern[..3] {
            return Err(format!(
                "BAR copies: the window shows {seen:02x?}, copied back {back:02x?}, expected {:02x?}",
                &pattern[..3]
            ));
        }
        println!(
            "raw-pci: mmap of BAR2, DMA_COPY buffer -> BAR2 and BAR2 -> buffer (3 B at BAR offset 4093, verified through the window): allowed"
        );
        return Ok(());
    }
    let refused = [
        ("mmap of BAR2", window.err().and_then(|e| e.errno())),
        ("DMA_COPY buffer -> BAR2", errno(to_bar)),
        (
            "DMA_COPY BAR2 -> buffer",
            errno(device.dma_copy_from_bar(2, 4093, &dst, 0, 3)),
        ),
    ];
    let mut wrong = Vec::new();
    for (what, got) in refused {
        println!("raw-pci: {what}: {got:?}");
        if got != Some(Errno::EPERM) {
            wrong.push(format!("{what}: expected EPERM, got {got:?}"));
        }
    }
    if !wrong.is_empty() {
        return Err(wrong.join("; "));
    }
    let mut back = [0u8; 3];
    dst_map.read(0, &mut back);
    if back != [0; 3] {
        return Err(format!("a refused BAR -> buffer copy wrote {back:02x?}"));
    }
    Ok(())
}

fn errno(result: Result<DmaTicket, DeviceError>) -> Option<Errno> {
    result.err().and_then(|e| e.errno())
}

fn done(device: &Device, ticket: &DmaTicket) -> CheckResult {
    match device
        .dma_wait(ticket, Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?
    {
        DmaWaitResult::Done => Ok(()),
        other => Err(format!("ticket {}: {other:?}", ticket.ticket)),
    }
}
