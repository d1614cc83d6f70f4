// SPDX-License-Identifier: GPL-2.0

//! What LIST reports about a device that 7.3's `pci::Device` does not expose:
//! BDF and BAR flags. Read once at probe through the raw `struct pci_dev`, in
//! this one place.

use kernel::{bindings, device::Bound, io::Io, pci};

use crate::{bound_device::BarInfo, uapi};

/// The raw `struct pci_dev` behind `pdev`.
pub(crate) fn raw<Ctx: kernel::device::DeviceContext>(
    pdev: &pci::Device<Ctx>,
) -> *mut bindings::pci_dev {
    // `pci::Device` is `repr(transparent)` over `Opaque<bindings::pci_dev>`,
    // whose `UnsafeCell` allows writes through the pointer.
    core::ptr::from_ref(pdev).cast_mut().cast()
}

/// `domain << 16 | bus << 8 | devfn` of `dev`, or `PCIEIPC_BDF_NONE`.
pub(crate) fn bdf_of(dev: *mut bindings::pci_dev) -> u32 {
    if dev.is_null() {
        return uapi::PCIEIPC_BDF_NONE;
    }
    // SAFETY: `dev` is a live `pci_dev`: the caller's bound device or the
    // bridge above it, which outlives it; `bus` is set for every device, and
    // the device name ("DDDD:BB:DD.F") is set before the device is added.
    let (bus, devfn, name) = unsafe {
        let name = core::ffi::CStr::from_ptr((*dev).dev.kobj.name.cast());
        ((*(*dev).bus).number, (*dev).devfn, name.to_bytes())
    };
    // pci_domain_nr() is arch-specific and inline: the domain is the name's
    // first, hexadecimal, field.
    let domain = name
        .iter()
        .take_while(|&&c| c != b':')
        .filter_map(|&c| (c as char).to_digit(16))
        .fold(0u32, |acc, digit| (acc << 4) | digit);
    (domain << 16) | (u32::from(bus) << 8) | (devfn & 0xff)
}

pub(crate) fn bdf(pdev: &pci::Device<Bound>) -> u32 {
    bdf_of(raw(pdev))
}

/// The BARs that hold the MSI-X table and pending-bit array: never mapped
/// into userspace (a process could retarget the interrupts), as in VFIO.
fn msix_bars(pdev: &pci::Device<Bound>) -> [Option<usize>; 2] {
    // SAFETY: `raw(pdev)` is the live, bound `pci_dev`.
    let cap = unsafe { bindings::pci_find_capability(raw(pdev), bindings::PCI_CAP_ID_MSIX as i32) };
    if cap == 0 {
        return [None, None];
    }
    let config = pdev.config_space();
    let bir = |reg: u32| {
        config
            .try_read32(usize::from(cap) + reg as usize)
            .ok()
            .map(|v| (v & bindings::PCI_MSIX_TABLE_BIR) as usize)
    };
    [bir(bindings::PCI_MSIX_TABLE), bir(bindings::PCI_MSIX_PBA)]
}

/// Start, size and `PCIEIPC_BAR_*` flags of every standard BAR. BAR
/// `registers`, which the module drives itself, is not offered to mmap.
pub(crate) fn bars(
    pdev: &pci::Device<Bound>,
    registers: Option<usize>,
) -> [BarInfo; uapi::PCIEIPC_NUM_BARS as usize] {
    let mut bars = [BarInfo::default(); uapi::PCIEIPC_NUM_BARS as usize];
    let msix = msix_bars(pdev);
    for (index, bar) in bars.iter_mut().enumerate() {
        let size = pdev.resource_len(index as u32).unwrap_or(0);
        if size == 0 {
            continue;
        }
        // SAFETY: `index` < PCIEIPC_NUM_BARS (6) < the 17 resources of a pci_dev.
        let res_flags = unsafe { (*raw(pdev)).resource[index].flags } as u32;
        let mut flags = 0;
        if res_flags & bindings::IORESOURCE_MEM != 0 {
            flags |= uapi::PCIEIPC_BAR_MEM;
            let private = registers == Some(index) || msix.contains(&Some(index));
            if size >= kernel::page::PAGE_SIZE as u64 && !private {
                flags |= uapi::PCIEIPC_BAR_MMAP;
            }
        }
        if res_flags & bindings::IORESOURCE_IO != 0 {
            flags |= uapi::PCIEIPC_BAR_IO;
        }
        if res_flags & bindings::IORESOURCE_MEM_64 != 0 {
            flags |= uapi::PCIEIPC_BAR_64BIT;
        }
        if res_flags & bindings::IORESOURCE_PREFETCH != 0 {
            flags |= uapi::PCIEIPC_BAR_PREFETCH;
        }
        *bar = BarInfo {
            start: pdev.resource_start(index as u32).unwrap_or(0),
            size,
            flags,
        };
    }
    bars
}

/// The raw `struct device` of `pdev` (the DMA API takes it).
pub(crate) fn raw_device(pdev: &pci::Device) -> *mut bindings::device {
    // SAFETY: `raw(pdev)` is a live `pci_dev`; `dev` is embedded in it.
    unsafe { core::ptr::addr_of_mut!((*raw(pdev)).dev) }
}
