//! Mappings, DMA memory and INTx under hardening (tests/guest/hardening-mappings.sh).

use std::{
    path::Path,
    thread::sleep,
    time::{Duration, Instant},
};

use pcieipc::device::{Device, WaitResult};

use crate::common::{open, CheckResult};

/// Maps 4 KiB of BAR `bar` of device `device` through the device node
/// `node`, writes a byte and reads it back, then unmaps and closes.
pub fn mmap_node(node: &Path, device: u32, bar: u32) -> CheckResult {
    let file = Device::open(node).map_err(|e| e.to_string())?;
    let window = file
        .map_bar(device, bar, 0, 4096)
        .map_err(|e| e.to_string())?;
    window.write(0, &[0xa5]);
    let mut byte = [0u8; 1];
    window.read(0, &mut byte);
    println!(
        "mmap-node: BAR{bar} of device {device} through {}: wrote 0xa5, read {:#x}",
        node.display(),
        byte[0]
    );
    Ok(())
}

/// Allocates a DMA buffer of `size` bytes for `device`, maps it, fills it
/// and checks it, says `ready`, waits for `go`, then reads and writes it
/// again: after the device is unbound (its buffer freed) the module maps its
/// stand-in page there, and the process lives on.
pub fn dma_touch(device: u32, size: u64, ready: &Path, go: &Path) -> CheckResult {
    let file = open()?;
    let buffer = file.dma_alloc(device, size).map_err(|e| e.to_string())?;
    let window = file.map_dma(&buffer).map_err(|e| e.to_string())?;
    let pattern: Vec<u8> = (0..window.len()).map(|i| (i % 251) as u8).collect();
    window.write(0, &pattern);
    let mut back = vec![0u8; window.len()];
    window.read(0, &mut back);
    if back != pattern {
        return Err("DMA buffer: read back differs from what was written".into());
    }
    println!(
        "dma-touch: {} bytes of DMA buffer {} (device {device}) mapped, filled, verified",
        window.len(),
        buffer.handle
    );
    std::fs::write(ready, b"mapped\n").map_err(|e| e.to_string())?;
    while !go.exists() {
        sleep(Duration::from_millis(20));
    }
    let mut byte = [0u8; 1];
    window.read(window.len() - 1, &mut byte);
    window.write(window.len() - 1, &[0xa7]);
    println!(
        "dma-touch: read {:#x} at the buffer's last byte after the go signal, then wrote it",
        byte[0]
    );
    Ok(())
}

/// e1000's registers (BAR0): Interrupt Cause Read (read clears), Interrupt
/// Cause Set, Interrupt Mask Set.
const E1000_ICR: usize = 0xc0;
const E1000_ICS: usize = 0xc8;
const E1000_IMS: usize = 0xd0;
/// Link Status Change, a cause any e1000 can be told to raise.
const E1000_LSC: u32 = 1 << 2;

/// The Command and Status registers of PCI function `bdf`, from sysfs.
fn command_status(bdf: &str) -> Result<(u16, u16), String> {
    let path = format!("/sys/bus/pci/devices/{bdf}/config");
    let config = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
    if config.len() < 8 {
        return Err(format!("{path}: {} bytes", config.len()));
    }
    Ok((
        u16::from_le_bytes([config[4], config[5]]),
        u16::from_le_bytes([config[6], config[7]]),
    ))
}

/// Command: Interrupt Disable. Status: Interrupt Status.
const COMMAND_INTX_DISABLE: u16 = 1 << 10;
const STATUS_INTERRUPT: u16 = 1 << 3;

/// Makes e1000 `device` (PCI function `bdf`) hold its INTx line asserted
/// and checks that the module masks it instead of storming: one interrupt
/// counted, the line masked, no more while the waiter has not come back; a
/// waiter that comes back while the line is still asserted sees one more at
/// once; after the cause is cleared, a waiter times out with nothing new.
pub fn intx_level(device: u32, bdf: &str) -> CheckResult {
    let file = open()?;
    let regs = file
        .map_bar(device, 0, 0, 0x1000)
        .map_err(|e| e.to_string())?;
    let write32 = |offset: usize, value: u32| regs.write(offset, &value.to_le_bytes());
    let read32 = |offset: usize| {
        let mut word = [0u8; 4];
        regs.read(offset, &mut word);
        u32::from_le_bytes(word)
    };
    let before = file.counters(device).map_err(|e| e.to_string())?[0];
    // Clear stale causes, then raise and keep raised a Link Status Change.
    read32(E1000_ICR);
    write32(E1000_IMS, E1000_LSC);
    write32(E1000_ICS, E1000_LSC);
    let first = match file.wait(device, 0, before, Some(Duration::from_secs(2))) {
        Ok(WaitResult::Interrupt(count)) => count,
        other => return Err(format!("no interrupt after raising INTx: {other:?}")),
    };
    sleep(Duration::from_millis(500));
    let settled = file.counters(device).map_err(|e| e.to_string())?[0];
    let (command, status) = command_status(bdf)?;
    println!(
        "intx: counted {} -> {first}, {settled} after 500 ms; Command {command:#06x}, Status {status:#06x}",
        before
    );
    if settled != first || first != before + 1 {
        return Err(format!(
            "the asserted line was counted {} times, not once",
            settled - before
        ));
    }
    if command & COMMAND_INTX_DISABLE == 0 || status & STATUS_INTERRUPT == 0 {
        return Err("the asserted INTx line is not masked (Interrupt Disable clear)".into());
    }
    let start = Instant::now();
    let again = match file.wait(device, 0, settled, Some(Duration::from_secs(2))) {
        Ok(WaitResult::Interrupt(count)) => count,
        other => {
            return Err(format!(
                "still asserted, but the waiter saw nothing: {other:?}"
            ))
        }
    };
    println!(
        "intx: a waiter coming back with the line still asserted saw {again} in {:?}",
        start.elapsed()
    );
    if again != settled + 1 {
        return Err(format!("expected count {}, got {again}", settled + 1));
    }
    // The cause is read (cleared): the line drops.
    let cause = read32(E1000_ICR);
    println!("intx: ICR {cause:#x} read and cleared");
    match file.wait(device, 0, again, Some(Duration::from_millis(300))) {
        Ok(WaitResult::TimedOut) => {}
        other => {
            return Err(format!(
                "after clearing the cause: {other:?}, not a timeout"
            ))
        }
    }
    let (command, _) = command_status(bdf)?;
    let last = file.counters(device).map_err(|e| e.to_string())?[0];
    println!("intx: after clearing the cause: count {last}, Command {command:#06x}");
    if command & COMMAND_INTX_DISABLE != 0 || last != again {
        return Err("the line stayed masked or counted again after its cause was cleared".into());
    }
    Ok(())
}

/// The page faults this thread has taken that needed no I/O: a fault on a
/// BAR window counts there.
fn minor_faults() -> Result<i64, String> {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_THREAD)
        .map(|usage| usage.minor_page_faults())
        .map_err(|e| format!("getrusage: {e}"))
}

/// A 32-bit read of the register at `offset` of a mapped BAR.
fn read32(window: &pcieipc::device::MappedWindow, offset: usize) -> u32 {
    assert!(offset + 4 <= window.len() && offset.is_multiple_of(4));
    // SAFETY: in bounds of a live mapping, 4-byte aligned.
    unsafe { (window.as_ptr().add(offset) as *const u32).read_volatile() }
}

/// A function reset of `device` zaps its mapped BAR0 page (a read of the
/// register at `offset` faults again after the reset, not before), and a
/// thread reading that register all through five resets always reads what
/// it read before them: never the device mid-reset, when the reset has
/// turned its memory decoding off; its faults wait for the reset's end.
pub fn reset_mapping(device: u32, offset: usize) -> CheckResult {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let file = open()?;
    let window = file
        .map_bar(device, 0, 0, 4096)
        .map_err(|e| e.to_string())?;
    let value = read32(&window, offset);
    let faults_before = minor_faults()?;
    read32(&window, offset);
    let faults_mapped = minor_faults()? - faults_before;
    let took = file.reset(device).map_err(|e| e.to_string())?;
    let faults_before = minor_faults()?;
    let value_after = read32(&window, offset);
    let faults_reset = minor_faults()? - faults_before;
    println!(
        "reset-mapping: register {offset:#x} read {value:#x}, then {value_after:#x} after a reset ({took:?}); page faults of one read: {faults_mapped} before the reset, {faults_reset} after it"
    );
    if value_after != value {
        return Err("the register reads differently after the reset".into());
    }
    if faults_mapped != 0 || faults_reset == 0 {
        return Err("the reset did not zap the mapped BAR page".into());
    }
    let stop = AtomicBool::new(false);
    let (reads, different) = (AtomicU64::new(0), AtomicU64::new(0));
    let resets = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                if read32(&window, offset) != value {
                    different.fetch_add(1, Ordering::Relaxed);
                }
                reads.fetch_add(1, Ordering::Relaxed);
            }
        });
        let mut resets = Vec::new();
        for _ in 0..5 {
            sleep(Duration::from_millis(20));
            resets.push(file.reset(device).map_err(|e| e.to_string()));
        }
        sleep(Duration::from_millis(20));
        stop.store(true, Ordering::Relaxed);
        resets
    });
    let (reads, different) = (reads.into_inner(), different.into_inner());
    println!("reset-mapping: a reader through 5 resets: {reads} reads, {different} not {value:#x}");
    for reset in resets {
        reset?;
    }
    if different != 0 || reads == 0 {
        return Err(format!(
            "{different} of {reads} reads during the resets reached the device mid-reset"
        ));
    }
    Ok(())
}

/// Allocates two buffers of `size` bytes for `device` and copies between
/// them back to back, while another thread allocates and frees buffers of
/// the same size on files of its own; says `ready` after the first copy,
/// and goes on until the device goes (unbound, removed). Every call must
/// end in success or the errno of a device that went.
pub fn dma_race(device: u32, size: u64, ready: &Path) -> CheckResult {
    use nix::errno::Errno;
    use std::sync::atomic::{AtomicBool, Ordering};
    let gone =
        |e: &pcieipc::device::DeviceError| matches!(e.errno(), Some(Errno::ENODEV | Errno::ENOENT));
    let copier = || -> Result<u64, String> {
        let file = open()?;
        let a = file.dma_alloc(device, size).map_err(|e| e.to_string())?;
        let b = file.dma_alloc(device, size).map_err(|e| e.to_string())?;
        let mut copies = 0u64;
        loop {
            let (src, dst) = if copies.is_multiple_of(2) {
                (&a, &b)
            } else {
                (&b, &a)
            };
            let ticket = match file.dma_copy((src, 0), (dst, 0), size) {
                Ok(ticket) => ticket,
                Err(e) if gone(&e) => return Ok(copies),
                Err(e) => return Err(e.to_string()),
            };
            match file.dma_wait(&ticket, Some(Duration::from_secs(10))) {
                Ok(pcieipc::device::DmaWaitResult::Done) => {}
                Err(e) if gone(&e) => return Ok(copies),
                other => return Err(format!("copy {copies}: {other:?}")),
            }
            copies += 1;
            if copies == 1 {
                std::fs::write(ready, b"copying\n").map_err(|e| e.to_string())?;
            }
        }
    };
    let copying = AtomicBool::new(true);
    let allocator = || -> Result<u64, String> {
        let mut allocations = 0u64;
        while copying.load(Ordering::Relaxed) {
            let file = open()?;
            match file.dma_alloc(device, size) {
                Ok(_) => allocations += 1,
                Err(e) if gone(&e) => return Ok(allocations),
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(allocations)
    };
    let (copies, allocations) = std::thread::scope(|scope| {
        let allocating = scope.spawn(allocator);
        let copies = copier();
        // A copier that failed must not leave the allocator running.
        copying.store(false, Ordering::Relaxed);
        (copies, allocating.join().expect("allocator thread"))
    });
    let (copies, allocations) = (copies?, allocations?);
    println!("dma-race: {copies} copies and {allocations} allocations of {size} bytes before the device went");
    if copies == 0 {
        return Err("no copy completed before the device went".into());
    }
    Ok(())
}

/// edu `edu` and e1000 `nic` (PCI function `nic_bdf`) on one INTx line:
/// an interrupt of one is never counted for the other. The NIC holds its
/// line asserted (masked by its handler) while edu interrupts for its DMA
/// copies (two per page copied): the NIC's handler must not count edu's
/// (its masked line cannot be its own), and edu's must not count the
/// NIC's (no status bit set).
pub fn intx_shared(edu: u32, nic: u32, nic_bdf: &str) -> CheckResult {
    const COPIES: u64 = 5;
    let file = open()?;
    let nic_regs = file.map_bar(nic, 0, 0, 0x1000).map_err(|e| e.to_string())?;
    let count = |device: u32| -> Result<u64, String> {
        Ok(file.counters(device).map_err(|e| e.to_string())?[0])
    };
    let (edu_before, nic_before) = (count(edu)?, count(nic)?);
    let read_nic = |offset: usize| read32(&nic_regs, offset);
    read_nic(E1000_ICR);
    nic_regs.write(E1000_IMS, &E1000_LSC.to_le_bytes());
    nic_regs.write(E1000_ICS, &E1000_LSC.to_le_bytes());
    match file.wait(nic, 0, nic_before, Some(Duration::from_secs(2))) {
        Ok(WaitResult::Interrupt(_)) => {}
        other => return Err(format!("no interrupt from the NIC: {other:?}")),
    }
    sleep(Duration::from_millis(200));
    let (edu_after_nic, nic_masked) = (count(edu)?, count(nic)?);
    let (command, _) = command_status(nic_bdf)?;
    println!(
        "intx-shared: the NIC's interrupt: NIC {nic_before} -> {nic_masked}, edu {edu_before} -> {edu_after_nic}; NIC Command {command:#06x}"
    );
    if edu_after_nic != edu_before {
        return Err("edu counted the NIC's interrupt on their shared line".into());
    }
    if nic_masked != nic_before + 1 || command & COMMAND_INTX_DISABLE == 0 {
        return Err("the NIC's asserted line was not counted once and masked".into());
    }
    let src = file.dma_alloc(edu, 4096).map_err(|e| e.to_string())?;
    let dst = file.dma_alloc(edu, 4096).map_err(|e| e.to_string())?;
    for copy in 0..COPIES {
        let ticket = file
            .dma_copy((&src, 0), (&dst, 0), 4096)
            .map_err(|e| e.to_string())?;
        match file.dma_wait(&ticket, Some(Duration::from_secs(5))) {
            Ok(pcieipc::device::DmaWaitResult::Done) => {}
            other => return Err(format!("edu's copy {copy}: {other:?}")),
        }
    }
    sleep(Duration::from_millis(200));
    let (edu_end, nic_end) = (count(edu)?, count(nic)?);
    println!(
        "intx-shared: {COPIES} copies on edu: edu {edu_after_nic} -> {edu_end}, NIC {nic_masked} -> {nic_end}"
    );
    read_nic(E1000_ICR);
    if edu_end != edu_after_nic + 2 * COPIES {
        return Err(format!(
            "edu counted {} interrupts for {COPIES} one-page copies, not {}",
            edu_end - edu_after_nic,
            2 * COPIES
        ));
    }
    if nic_end != nic_masked {
        return Err(format!(
            "the NIC, its line masked, counted {} of edu's interrupts",
            nic_end - nic_masked
        ));
    }
    Ok(())
}

/// The bus addresses edu's DMA engine reaches (QEMU's default dma_mask).
const EDU_DMA_REACH: u64 = 1 << 28;

/// Allocates `buffers` DMA buffers of `size` bytes for edu `device` (over
/// a page: from the CMA area where it is within reach, which the testbed
/// kernel places at the top of memory): every one must lie within edu's
/// 28-bit reach, and a page copied by edu from the highest buffer to the
/// next highest must arrive (edu masks what it is told: an address above
/// its reach would read and write other memory).
pub fn dma_reach(device: u32, buffers: usize, size: u64) -> CheckResult {
    let file = open()?;
    let mut allocated = (0..buffers)
        .map(|_| file.dma_alloc(device, size).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    allocated.sort_by_key(|buffer| buffer.bus_addr);
    let addresses: Vec<String> = allocated
        .iter()
        .map(|buffer| format!("{:#x}", buffer.bus_addr))
        .collect();
    println!("dma-reach: bus addresses {}", addresses.join(" "));
    let (src, dst) = match allocated.as_slice() {
        [.., dst, src] => (src, dst),
        _ => return Err("two buffers or more are needed".into()),
    };
    let pattern: Vec<u8> = (0..4096).map(|i| (i * 7 + 3) as u8).collect();
    let (src_window, dst_window) = (
        file.map_dma(src).map_err(|e| e.to_string())?,
        file.map_dma(dst).map_err(|e| e.to_string())?,
    );
    src_window.write(0, &pattern);
    let ticket = file
        .dma_copy((src, 0), (dst, 0), 4096)
        .map_err(|e| e.to_string())?;
    match file.dma_wait(&ticket, Some(Duration::from_secs(5))) {
        Ok(pcieipc::device::DmaWaitResult::Done) => {}
        other => return Err(format!("edu's copy: {other:?}")),
    }
    let mut arrived = vec![0u8; 4096];
    dst_window.read(0, &mut arrived);
    println!(
        "dma-reach: a page copied by edu from {:#x} to {:#x}: {}",
        src.bus_addr,
        dst.bus_addr,
        if arrived == pattern {
            "arrived"
        } else {
            "wrong"
        }
    );
    if src.bus_addr + src.size > EDU_DMA_REACH {
        return Err(format!(
            "a buffer at {:#x}, beyond edu's 28-bit reach",
            src.bus_addr
        ));
    }
    if arrived != pattern {
        return Err("edu's copy did not arrive".into());
    }
    Ok(())
}
