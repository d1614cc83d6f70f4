// SPDX-License-Identifier: GPL-2.0

//! mmap of BAR windows: the file offset names (device index, BAR, offset in
//! the BAR), as VFIO's region offsets do; the window is remapped uncached.
//!
//! 7.3 has no abstraction to remap device memory into userspace: this file is
//! the one place that calls `remap_pfn_range` on a `VmaNew`.

use kernel::{bindings, mm::virt::VmaNew, page::PAGE_SHIFT, prelude::*};

use crate::{device_ioctls::require_sys_admin, registry, uapi};

const BAR_SHIFT: u32 = uapi::PCIEIPC_MMAP_BAR_SHIFT;
const INDEX_SHIFT: u32 = uapi::PCIEIPC_MMAP_INDEX_SHIFT;

/// `PCIEIPC_MMAP_OFFSET(index, bar)`.
pub(crate) fn mmap_offset(index: u32, bar: u32) -> u64 {
    (u64::from(index) << INDEX_SHIFT) | (u64::from(bar) << BAR_SHIFT)
}

extern "C" {
    /// `pgprot_noncached` (helpers.c).
    fn pcieipc_pgprot_noncached(prot: bindings::pgprot_t) -> bindings::pgprot_t;
}

/// Maps the window the VMA's offset names, or refuses: `ENOENT` (no such
/// device), `ENODEV` (gone), `EINVAL` (no such BAR, not a mappable memory
/// BAR, or the window passes the BAR's end), `EPERM`.
pub(crate) fn mmap(vma: &VmaNew, offset: u64) -> Result {
    require_sys_admin()?;
    let index = u32::try_from(offset >> INDEX_SHIFT).map_err(|_| EINVAL)?;
    let bar = ((offset >> BAR_SHIFT) & ((1 << (INDEX_SHIFT - BAR_SHIFT)) - 1)) as usize;
    let in_bar = offset & ((1u64 << BAR_SHIFT) - 1);
    let device = registry::get(index)?;
    device.check_usable()?;
    let info = device.info.bars.get(bar).ok_or(EINVAL)?;
    if info.flags & uapi::PCIEIPC_BAR_MMAP == 0 {
        return Err(EINVAL);
    }
    let len = (vma.end() - vma.start()) as u64;
    let end = in_bar.checked_add(len).ok_or(EINVAL)?;
    if end > info.size {
        return Err(EINVAL);
    }
    vma.set_dontcopy();
    let phys = info.start + in_bar;
    // SAFETY: `vma` is a VMA under construction whose pages are not yet
    // mapped; [phys, phys + len) lies inside a memory BAR of a bound device
    // (checked above), page aligned (BARs of at least a page are aligned to
    // their size; `in_bar` is a page multiple). remap_pfn_range marks the VMA
    // VM_IO | VM_PFNMAP, so the core never treats these pages as RAM.
    let ret = unsafe {
        let raw = vma.as_ptr();
        (*raw).vm_page_prot = pcieipc_pgprot_noncached((*raw).vm_page_prot);
        bindings::remap_pfn_range(
            raw,
            vma.start(),
            (phys >> PAGE_SHIFT) as usize,
            len as usize,
            (*raw).vm_page_prot,
        )
    };
    kernel::error::to_result(ret)
}

/// The file offset of `vma` (a VMA under construction), or EINVAL when it
/// does not fit 64 bits.
pub(crate) fn file_offset(vma: &VmaNew) -> Result<u64> {
    // SAFETY: `vma` is a VMA under construction; `vm_pgoff` is plain data.
    let pgoff = unsafe { (*vma.as_ptr()).vm_pgoff } as u64;
    let offset = pgoff.checked_shl(PAGE_SHIFT as u32).ok_or(EINVAL)?;
    if offset >> PAGE_SHIFT != pgoff {
        return Err(EINVAL);
    }
    Ok(offset)
}
