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
