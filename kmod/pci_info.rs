// SPDX-License-Identifier: GPL-2.0

//! What the module needs of a bound device that 7.3's `pci::Device` does not
//! expose: its BDF, the flags of its BARs (what LIST reports, read once at
//! probe), the `struct device` that the DMA API takes, bus mastering, INTx
//! masking, and ID table entries of vendors that `pci::Vendor` cannot name. This is the one place that
//! reads the raw `struct pci_dev` of a bound device.

use kernel::{bindings, device::Bound, io::Io, pci, prelude::*};

use crate::uapi;

/// One BAR as probe found it.
#[derive(Clone, Copy, Default)]
pub(crate) struct BarInfo {
    /// Bus-independent physical start (what `remap_pfn_range` takes).
    pub(crate) start: u64,
    pub(crate) size: u64,
    /// `PCIEIPC_BAR_*` flags.
    pub(crate) flags: u32,
}

/// A BAR mapped into the kernel (registers, or a window that copies reach),
/// revoked on unbind.
pub(crate) type MappedBar = pci::DevresBar;

/// The ID table entry of `vendor:device`. `pci::DeviceId::from_id` takes a
/// `pci::Vendor`, which names only pci_ids.h vendors (QEMU's 0x1234 is not
/// one of them).
pub(crate) const fn device_id(vendor: u16, device: u16) -> pci::DeviceId {
    let raw = bindings::pci_device_id {
        vendor: vendor as u32,
        device: device as u32,
        subvendor: !0,
        subdevice: !0,
        class: 0,
        class_mask: 0,
        driver_data: 0,
        override_only: 0,
    };
    // SAFETY: `pci::DeviceId` is `repr(transparent)` over `pci_device_id`
    // and carries no invariant beyond its fields; these are the fields that
    // `from_id` writes for a vendor it can name.
    unsafe { core::mem::transmute::<bindings::pci_device_id, pci::DeviceId>(raw) }
}

/// The raw `struct pci_dev` behind `pdev`.
pub(crate) fn raw<Ctx: kernel::device::DeviceContext>(
    pdev: &pci::Device<Ctx>,
) -> *mut bindings::pci_dev {
    // `pci::Device` is `repr(transparent)` over `Opaque<bindings::pci_dev>`,
    // whose `UnsafeCell` allows writes through the pointer.
    core::ptr::from_ref(pdev).cast_mut().cast()
}

/// `PCIEIPC_BDF(domain, bus, devfn)` of `pdev`, or `None` in a PCI domain
/// above 0xffff (VMD's start at 0x10000): the encoding has 16 bits for the
/// domain, and a truncated one would name a device of domain 0.
pub(crate) fn bdf<Ctx: kernel::device::DeviceContext>(pdev: &pci::Device<Ctx>) -> Option<u32> {
    let dev = raw(pdev);
    // SAFETY: `dev` is the live `pci_dev` behind `pdev`; `bus` is set for
    // every device, and the device name ("DDDD:BB:DD.F") is set before the
    // device is added.
    let (bus, devfn, name) = unsafe {
        let name = CStr::from_char_ptr((*dev).dev.kobj.name);
        ((*(*dev).bus).number, (*dev).devfn, name.to_bytes())
    };
    // pci_domain_nr() is arch-specific and inline: the domain is the name's
    // first, hexadecimal, field.
    let domain = name
        .iter()
        .take_while(|&&c| c != b':')
        .filter_map(|&c| (c as char).to_digit(16))
        .try_fold(0u16, |acc, digit| {
            acc.checked_mul(16)?.checked_add(digit as u16)
        })?;
    Some((u32::from(domain) << 16) | (u32::from(bus) << 8) | (devfn & 0xff))
}

/// Sets or clears Bus Master Enable in `pdev`'s Command register. The
/// caller makes sure the device is still bound (or being unbound).
pub(crate) fn set_bus_master<Ctx: kernel::device::DeviceContext>(
    pdev: &pci::Device<Ctx>,
    on: bool,
) {
    // SAFETY: `raw(pdev)` is a live `pci_dev` (`pdev` holds it);
    // `pci_set_master`/`pci_clear_master` do a config read-modify-write of
    // its Command register.
    unsafe {
        if on {
            bindings::pci_set_master(raw(pdev))
        } else {
            bindings::pci_clear_master(raw(pdev))
        }
    };
}

/// Masks `pdev`'s INTx (Interrupt Disable) if the device is asserting it
/// (PCI 2.3 Interrupt Status); returns whether it was. A device that cannot
/// say gets `false`: its interrupt is not the module's to claim.
pub(crate) fn check_and_mask_intx<Ctx: kernel::device::DeviceContext>(
    pdev: &pci::Device<Ctx>,
) -> bool {
    // SAFETY: `raw(pdev)` is a live `pci_dev`; the function takes the PCI
    // config lock itself and may run in hard IRQ context.
    unsafe { bindings::pci_check_and_mask_intx(raw(pdev)) }
}

/// Unmasks `pdev`'s INTx unless the device is still asserting it; returns
/// whether it unmasked.
pub(crate) fn check_and_unmask_intx<Ctx: kernel::device::DeviceContext>(
    pdev: &pci::Device<Ctx>,
) -> bool {
    // SAFETY: as for `check_and_mask_intx`.
    unsafe { bindings::pci_check_and_unmask_intx(raw(pdev)) }
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
