//! DMA copies: edu's engine and the CPU fallback, verified byte for byte.

use std::time::{Duration, Instant};

use nix::errno::Errno;
use pcieipc::device::{DeviceKind, DmaEngine, DmaTicket, DmaWaitResult};

use super::common::{bound, open, CheckResult};

/// edu moves 4 KiB per 100 ms command, twice per chunk: 1 MiB takes ~51 s.
const COPY_LIMIT: Duration = Duration::from_secs(150);

fn kind_of(name: &str) -> Result<DeviceKind, String> {
    match name {
        "edu" => Ok(DeviceKind::Edu),
        "ivshmem" => Ok(DeviceKind::Ivshmem),
        "generic" => Ok(DeviceKind::Generic),
        _ => Err(format!("unknown device kind {name:?}")),
    }
}

fn wait_done(device: &pcieipc::device::Device, ticket: &DmaTicket) -> CheckResult {
    match device
        .dma_wait(ticket, Some(COPY_LIMIT))
        .map_err(|e| e.to_string())?
    {
        DmaWaitResult::Done => Ok(()),
        other => Err(format!("ticket {}: {other:?}", ticket.ticket)),
    }
}

/// `dma-copy`: for each size, a copy between two buffers of the first bound
/// device of `kind`, by the engine expected for it, checked byte for byte
/// (and the bytes around the destination range left alone).
pub fn copy(kind: &str, sizes: &[u64]) -> CheckResult {
    let kind = kind_of(kind)?;
    let expected = if kind == DeviceKind::Edu {
        DmaEngine::Edu
    } else {
        DmaEngine::Cpu
    };
    let device = open()?;
    let target = bound(&device, kind)?
        .into_iter()
        .next()
        .ok_or_else(|| format!("no bound {kind:?} device"))?;
    for &size in sizes {
        // One guard page's worth of bytes after the destination range.
        let src = device
            .dma_alloc(target.index, size)
            .map_err(|e| e.to_string())?;
        let dst = device
            .dma_alloc(target.index, size + 1)
            .map_err(|e| e.to_string())?;
        let src_map = device.map_dma(&src).map_err(|e| e.to_string())?;
        let dst_map = device.map_dma(&dst).map_err(|e| e.to_string())?;
        let pattern: Vec<u8> = (0..size).map(|i| (i * 7 + size + i / 251) as u8).collect();
        src_map.write(0, &pattern);
        let sentinel = vec![0xa5u8; dst.size as usize];
        dst_map.write(0, &sentinel);
        let start = Instant::now();
        let ticket = device
            .dma_copy((&src, 0), (&dst, 0), size)
            .map_err(|e| e.to_string())?;
        wait_done(&device, &ticket)?;
        let elapsed = start.elapsed();
        let mut got = vec![0u8; dst.size as usize];
        dst_map.read(0, &mut got);
        if ticket.engine != expected {
            return Err(format!(
                "{size} B: engine {:?}, expected {expected:?}",
                ticket.engine
            ));
        }
        if let Some(at) = (0..size as usize).find(|&i| got[i] != pattern[i]) {
            return Err(format!(
                "{size} B: byte {at} is {:#x}, expected {:#x}",
                got[at], pattern[at]
            ));
        }
        if got[size as usize..].iter().any(|&b| b != 0xa5) {
            return Err(format!("{size} B: bytes past the copied range changed"));
        }
        println!(
            "dma-copy: {size} B on device {} ({kind:?}) by the {:?} engine, verified, {:.1} ms ({:.1} KiB/s)",
            target.index,
            ticket.engine,
            elapsed.as_secs_f64() * 1e3,
            size as f64 / 1024.0 / elapsed.as_secs_f64()
        );
    }
    Ok(())
}

/// `dma-errors`: bad copies are refused with the documented errno, and a
/// second copy while edu runs one gets EBUSY.
pub fn errors() -> CheckResult {
    let device = open()?;
    let edu = bound(&device, DeviceKind::Edu)?
        .into_iter()
        .next()
        .ok_or("no edu bound")?;
    let other = bound(&device, DeviceKind::Ivshmem)?
        .into_iter()
        .next()
        .ok_or("no ivshmem bound")?;
    let a = device
        .dma_alloc(edu.index, 4096)
        .map_err(|e| e.to_string())?;
    let b = device
        .dma_alloc(edu.index, 4096)
        .map_err(|e| e.to_string())?;
    let foreign = device
        .dma_alloc(other.index, 4096)
        .map_err(|e| e.to_string())?;
    let errno =
        |r: Result<DmaTicket, pcieipc::device::DeviceError>| r.err().and_then(|e| e.errno());
    let cases = [
        (
            "range past the source's end",
            errno(device.dma_copy((&a, 1), (&b, 0), 4096)),
            Errno::EINVAL,
        ),
        (
            "range past the destination's end",
            errno(device.dma_copy((&a, 0), (&b, 8), 4090)),
            Errno::EINVAL,
        ),
        (
            "length 0",
            errno(device.dma_copy((&a, 0), (&b, 0), 0)),
            Errno::EINVAL,
        ),
        (
            "a buffer of another device",
            errno(device.dma_copy((&a, 0), (&foreign, 0), 16)),
            Errno::EINVAL,
        ),
        (
            "size past PCIEIPC_DMA_MAX_SIZE",
            device
                .dma_alloc(edu.index, 64 << 20)
                .err()
                .and_then(|e| e.errno()),
            Errno::EINVAL,
        ),
        (
            "an unknown device",
            device.dma_alloc(9999, 4096).err().and_then(|e| e.errno()),
            Errno::ENOENT,
        ),
    ];
    for (what, got, expected) in cases {
        println!("dma-errors: {what}: {got:?}");
        if got != Some(expected) {
            return Err(format!("{what}: expected {expected}, got {got:?}"));
        }
    }
    let unknown = DmaTicket {
        ticket: 999_999,
        engine: DmaEngine::Cpu,
    };
    let got = device
        .dma_wait(&unknown, Some(Duration::ZERO))
        .err()
        .and_then(|e| e.errno());
    println!("dma-errors: wait on an unknown ticket: {got:?}");
    if got != Some(Errno::ENOENT) {
        return Err(format!("unknown ticket: expected ENOENT, got {got:?}"));
    }
    let first = device
        .dma_copy((&a, 0), (&b, 0), 16)
        .map_err(|e| e.to_string())?;
    let busy = errno(device.dma_copy((&b, 0), (&a, 0), 16));
    let early = device
        .dma_wait(&first, Some(Duration::ZERO))
        .map_err(|e| e.to_string())?;
    println!("dma-errors: second copy while edu runs one: {busy:?}; zero-timeout wait: {early:?}");
    if busy != Some(Errno::EBUSY) || early != DmaWaitResult::TimedOut {
        return Err(format!(
            "expected EBUSY and TimedOut, got {busy:?} and {early:?}"
        ));
    }
    wait_done(&device, &first)?;
    let again = device
        .dma_wait(&first, Some(Duration::ZERO))
        .err()
        .and_then(|e| e.errno());
    println!("dma-errors: the collected ticket again: {again:?}");
    if again != Some(Errno::ENOENT) {
        return Err(format!(
            "a collected ticket: expected ENOENT, got {again:?}"
        ));
    }
    Ok(())
}

/// `dma-bar`: a buffer of ivshmem device A copied into A's BAR2 window (CPU,
/// unaligned offset and length) is seen through device B's window of the
/// same region, and copied back into another buffer intact; bad BAR copies
/// are refused with EINVAL.
pub fn bar() -> CheckResult {
    let device = open()?;
    let pair = bound(&device, DeviceKind::Ivshmem)?;
    let [a, b] = pair.get(..2).ok_or("two ivshmem-doorbell devices needed")? else {
        unreachable!()
    };
    let len = 65_539u64;
    let bar_offset = 8_193u64;
    let src = device.dma_alloc(a.index, len).map_err(|e| e.to_string())?;
    let back = device.dma_alloc(a.index, len).map_err(|e| e.to_string())?;
    let src_map = device.map_dma(&src).map_err(|e| e.to_string())?;
    let back_map = device.map_dma(&back).map_err(|e| e.to_string())?;
    let pattern: Vec<u8> = (0..len).map(|i| (i * 11 + 3 + i / 509) as u8).collect();
    src_map.write(0, &pattern);
    let out = device
        .dma_copy_to_bar(&src, 0, 2, bar_offset, len)
        .map_err(|e| e.to_string())?;
    wait_done(&device, &out)?;
    let peer_window = device
        .map_bar(
            b.index,
            2,
            0,
            (bar_offset + len).next_multiple_of(4096) as usize,
        )
        .map_err(|e| e.to_string())?;
    let mut seen = vec![0u8; len as usize];
    peer_window.read(bar_offset as usize, &mut seen);
    if seen != pattern {
        return Err("the buffer copied into A's BAR2 is not what B's window shows".into());
    }
    let inbound = device
        .dma_copy_from_bar(2, bar_offset, &back, 0, len)
        .map_err(|e| e.to_string())?;
    wait_done(&device, &inbound)?;
    let mut got = vec![0u8; len as usize];
    back_map.read(0, &mut got);
    if got != pattern {
        return Err("the BAR2 window copied back into a buffer differs".into());
    }
    println!(
        "dma-bar: {len} B buffer -> BAR2 (offset {bar_offset}) of device {} by the {:?} engine, \
         seen through device {}'s window, and back: verified",
        a.index, out.engine, b.index
    );
    if out.engine != DmaEngine::Cpu || inbound.engine != DmaEngine::Cpu {
        return Err("BAR copies are CPU copies".into());
    }
    let errno =
        |r: Result<DmaTicket, pcieipc::device::DeviceError>| r.err().and_then(|e| e.errno());
    let size = a
        .bars
        .iter()
        .find(|bar| bar.index == 2)
        .map_or(0, |bar| bar.size);
    let cases = [
        (
            "into the register BAR0",
            errno(device.dma_copy_to_bar(&src, 0, 0, 0, 4)),
        ),
        (
            "into the MSI-X BAR1",
            errno(device.dma_copy_to_bar(&src, 0, 1, 0, 4)),
        ),
        (
            "past BAR2's end",
            errno(device.dma_copy_to_bar(&src, 0, 2, size - 2, 4)),
        ),
        ("BAR 7", errno(device.dma_copy_from_bar(7, 0, &back, 0, 4))),
        (
            "past the buffer's end",
            errno(device.dma_copy_from_bar(2, 0, &back, 65_536, 65_536)),
        ),
    ];
    for (what, got) in cases {
        println!("dma-bar: {what}: {got:?}");
        if got != Some(Errno::EINVAL) {
            return Err(format!("{what}: expected EINVAL, got {got:?}"));
        }
    }
    Ok(())
}
