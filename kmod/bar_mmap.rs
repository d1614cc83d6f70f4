// SPDX-License-Identifier: GPL-2.0

//! mmap of BAR windows: the file offset names (device index, BAR, offset in
//! the BAR), as VFIO's region offsets do; the window is mapped uncached, a
//! page at a time as it is touched. The driver zaps a device's windows when
//! it goes away; a later access maps the module's stand-in page
//! (`mappings`), never a BAR the module no longer owns. A function reset
//! zaps them too, and their faults wait for it to end.

use kernel::{
    mm::virt::VmaNew,
    page::{PAGE_SHIFT, PAGE_SIZE},
    prelude::*,
    sync::Arc,
};

use crate::{
    bound_device::BoundDevice,
    capability::{require_pci_access, require_sys_admin},
    mappings::{self, Backing},
    registry, uapi,
    user_mapping::{self, FaultMapped, Inserted, PageInsert},
};

const BAR_SHIFT: u32 = uapi::PCIEIPC_MMAP_BAR_SHIFT;
const INDEX_SHIFT: u32 = uapi::PCIEIPC_MMAP_INDEX_SHIFT;

/// `PCIEIPC_MMAP_OFFSET(index, bar)`.
pub(crate) fn mmap_offset(index: u32, bar: u32) -> u64 {
    (u64::from(index) << INDEX_SHIFT) | (u64::from(bar) << BAR_SHIFT)
}

/// Zaps every window of device `index` in every process: after the device
/// is marked gone (unbind, removal: no fault maps its BAR again), or marked
/// resetting (faults wait for the reset's end).
pub(crate) fn zap_device(index: u32) {
    mappings::zap(mmap_offset(index, 0), 1u64 << INDEX_SHIFT);
}

/// The device and the physical address of `len` bytes at BAR-window offset
/// `offset`, if they lie inside a mappable memory BAR of a device that is not
/// gone: `ENOENT` (no such device), `ENODEV` (gone), `EINVAL` (no such BAR,
/// not a mappable memory BAR, past the BAR's end).
fn window(offset: u64, len: u64) -> Result<(Arc<BoundDevice>, u64)> {
    let index = u32::try_from(offset >> INDEX_SHIFT).map_err(|_| EINVAL)?;
    let bar = ((offset >> BAR_SHIFT) & ((1 << (INDEX_SHIFT - BAR_SHIFT)) - 1)) as usize;
    let in_bar = offset & ((1u64 << BAR_SHIFT) - 1);
    let device = registry::get(index)?;
    if device.state() == uapi::PCIEIPC_STATE_GONE {
        return Err(ENODEV);
    }
    let info = device.info.bars.get(bar).ok_or(EINVAL)?;
    if info.flags & uapi::PCIEIPC_BAR_MMAP == 0 {
        return Err(EINVAL);
    }
    let end = in_bar.checked_add(len).ok_or(EINVAL)?;
    if end > info.size {
        return Err(EINVAL);
    }
    let phys = info.start + in_bar;
    Ok((device, phys))
}

/// Checks the window the VMA's offset names, and installs the fault handler
/// that maps it, or refuses: the errors of `window` (the device must also be
/// usable, not frozen), `EINVAL` for a private mapping, `EPERM` (no
/// CAP_SYS_ADMIN, or a kernel locked down against raw PCI access).
pub(crate) fn mmap(vma: &VmaNew, offset: u64) -> Result {
    require_sys_admin()?;
    require_pci_access()?;
    let len = (vma.end() - vma.start()) as u64;
    let (device, _) = window(offset, len)?;
    device.check_usable()?;
    user_mapping::install_fault_handler::<BarWindows>(vma)
}

/// The userspace mappings of BAR windows.
pub(crate) struct BarWindows;

impl FaultMapped for BarWindows {
    const UNCACHED: bool = true;

    fn fault(offset: u64, insert: PageInsert<'_>) -> Result<Inserted> {
        // A function reset in progress: sleep until it ends (a signal ends
        // the sleep, and the access faults again once it is handled).
        if let Ok((device, _)) = window(offset, PAGE_SIZE as u64) {
            if device.wait_for_reset().is_err() {
                return Ok(insert.retry());
            }
        }
        mappings::insert_page(insert, |_| match window(offset, PAGE_SIZE as u64) {
            // A reset began since the wait (its zap follows this decision).
            Ok((device, _)) if device.is_resetting() => Ok(Backing::Retry),
            Ok((_, phys)) => Ok(Backing::Frame(phys >> PAGE_SHIFT)),
            // mmap checked the window: its device went since.
            Err(e) if e == ENODEV => Ok(Backing::Gone),
            Err(e) => Err(e),
        })
    }
}
