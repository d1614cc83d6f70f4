//! The longest CPU copies the ABI allows between a DMA buffer and a BAR:
//! PCIEIPC_DMA_MAX_SIZE - 1 bytes (a full buffer less one byte, from an odd
//! buffer offset) to and from an odd offset of ivshmem's shared-memory BAR
//! that ends at the BAR's last byte, back to back, every byte verified.
//! Meanwhile a SCHED_FIFO thread on the same CPU wakes every millisecond:
//! how late it wakes is how long the copy kept the CPU without a preemption
//! point.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use nix::{
    sched::{sched_setaffinity, CpuSet},
    unistd::Pid,
};
use pcieipc::device::{Device, DeviceKind, DmaTicket, DmaWaitResult};
use pcieipc_uapi as uapi;

use super::common::{bound, open, shared_bar_size, CheckResult};

/// The copying thread and the probe share this CPU.
const CPU: usize = 0;

/// `bar-copy-long --rounds N --max-latency-ms MS`: each round writes a new
/// pattern into buffer A, copies it into BAR2 and from BAR2 into buffer B,
/// then checks B and the BAR window (mapped whole) against the pattern; the
/// probe's latest wake-up must stay under MS.
pub fn run(rounds: u32, max_latency_ms: u64) -> CheckResult {
    pin(CPU)?;
    let stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let stop = stop.clone();
        thread::spawn(move || probe(&stop))
    };
    let copies = copies(rounds);
    stop.store(true, Ordering::Relaxed);
    let latest = probe.join().map_err(|_| "the probe thread panicked")??;
    copies?;
    println!(
        "bar-copy-long: a SCHED_FIFO thread on CPU {CPU} woke at most {:.1} ms late (limit {max_latency_ms} ms)",
        latest.as_secs_f64() * 1e3
    );
    if latest > Duration::from_millis(max_latency_ms) {
        return Err(format!(
            "the copies held CPU {CPU} for {:.1} ms without a preemption point",
            latest.as_secs_f64() * 1e3
        ));
    }
    Ok(())
}

fn pin(cpu: usize) -> CheckResult {
    let mut set = CpuSet::new();
    set.set(cpu)
        .and_then(|()| sched_setaffinity(Pid::from_raw(0), &set))
        .map_err(|e| format!("sched_setaffinity to CPU {cpu}: {e}"))
}

/// Sleeps 1 ms at a time at SCHED_FIFO priority 1 on `CPU` until `stop`;
/// returns the longest overshoot.
fn probe(stop: &AtomicBool) -> Result<Duration, String> {
    pin(CPU)?;
    let param = nix::libc::sched_param { sched_priority: 1 };
    // SAFETY: `param` is a live sched_param; pid 0 is this thread.
    if unsafe { nix::libc::sched_setscheduler(0, nix::libc::SCHED_FIFO, &param) } != 0 {
        return Err(format!(
            "sched_setscheduler(SCHED_FIFO): {}",
            nix::errno::Errno::last()
        ));
    }
    let tick = Duration::from_millis(1);
    let mut latest = Duration::ZERO;
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        thread::sleep(tick);
        latest = latest.max(start.elapsed().saturating_sub(tick));
    }
    Ok(latest)
}

fn copies(rounds: u32) -> CheckResult {
    let device = open()?;
    let target = bound(&device, DeviceKind::Ivshmem)?
        .into_iter()
        .next()
        .ok_or("no ivshmem-doorbell device bound")?;
    let bar_size = shared_bar_size(&target)?;
    let buffer_size = uapi::PCIEIPC_DMA_MAX_SIZE as u64;
    let len = buffer_size - 1;
    if bar_size as u64 > uapi::PCIEIPC_DMA_BAR_MAX_SIZE as u64 || (bar_size as u64) < buffer_size {
        return Err(format!(
            "BAR2 of {bar_size} B: need {buffer_size} to {} B",
            uapi::PCIEIPC_DMA_BAR_MAX_SIZE
        ));
    }
    // Odd, and the copy ends at the BAR's last byte.
    let bar_offset = bar_size as u64 - len;
    let text = |e: pcieipc::device::DeviceError| e.to_string();
    let a = device.dma_alloc(target.index, buffer_size).map_err(text)?;
    let b = device.dma_alloc(target.index, buffer_size).map_err(text)?;
    let a_map = device.map_dma(&a).map_err(text)?;
    let b_map = device.map_dma(&b).map_err(text)?;
    let window = device.map_bar(target.index, 2, 0, bar_size).map_err(text)?;
    println!(
        "bar-copy-long: device {}, BAR2 {} MiB, buffers of {} MiB; each copy {len} B, buffer offset 1, BAR offset {bar_offset}",
        target.index,
        bar_size >> 20,
        buffer_size >> 20
    );
    let mut got = vec![0u8; len as usize];
    for round in 0..rounds {
        let pattern: Vec<u8> = (0..len)
            .map(|i| (i.wrapping_mul(31) ^ (i >> 13) ^ u64::from(round * 0x45)) as u8)
            .collect();
        a_map.write(1, &pattern);
        let start = Instant::now();
        let out = device
            .dma_copy_to_bar(&a, 1, 2, bar_offset, len)
            .map_err(text)?;
        done(&device, &out)?;
        let to_bar = start.elapsed();
        let start = Instant::now();
        let back = device
            .dma_copy_from_bar(2, bar_offset, &b, 0, len)
            .map_err(text)?;
        done(&device, &back)?;
        let from_bar = start.elapsed();
        b_map.read(0, &mut got);
        if let Some(at) = (0..got.len()).find(|&i| got[i] != pattern[i]) {
            return Err(format!(
                "round {round}: BAR2 -> buffer byte {at} is {:#x}, expected {:#x}",
                got[at], pattern[at]
            ));
        }
        window.read(bar_offset as usize, &mut got);
        if let Some(at) = (0..got.len()).find(|&i| got[i] != pattern[i]) {
            return Err(format!(
                "round {round}: the window shows byte {at} (BAR offset {}) as {:#x}, expected {:#x}",
                bar_offset as usize + at,
                got[at],
                pattern[at]
            ));
        }
        println!(
            "bar-copy-long: round {round}: buffer -> BAR2 {:.0} ms, BAR2 -> buffer {:.0} ms, verified (buffer and window)",
            to_bar.as_secs_f64() * 1e3,
            from_bar.as_secs_f64() * 1e3
        );
    }
    Ok(())
}

fn done(device: &Device, ticket: &DmaTicket) -> CheckResult {
    match device
        .dma_wait(ticket, Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?
    {
        DmaWaitResult::Done => Ok(()),
        other => Err(format!("ticket {}: {other:?}", ticket.ticket)),
    }
}
