// SPDX-License-Identifier: GPL-2.0

//! mmap of BAR windows: the file offset names (device index, BAR, offset in
//! the BAR), as VFIO's region offsets do; the window is remapped uncached.
//!
//! 7.3 has no abstraction to remap device memory into userspace: this file is
//! the one place that calls `remap_pfn_range` on a `VmaNew`, and that zaps a
//! device's windows when it goes away (a later access gets SIGBUS instead of
//! reaching a BAR the module no longer owns).

use kernel::{
    bindings,
    mm::virt::{flags, VmaNew},
    page::PAGE_SHIFT,
    prelude::*,
};

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

/// The inodes (device nodes of /dev/pcieipc) that BAR windows were mapped
/// through, each held (`ihold`) until the module unloads: their address
/// spaces hold every window, by file offset. Stored as addresses: raw
/// pointers are not `Send`.
pub(crate) struct MappedInodes(KVec<usize>);

kernel::sync::global_lock! {
    // SAFETY: initialised by `init` in the module initialiser, before the
    // misc device exists.
    unsafe(uninit) static MAPPED: Mutex<MappedInodes> = MappedInodes(KVec::new());
}

/// Initialises the inode list.
///
/// # Safety
///
/// Called once, before any other function of this module.
pub(crate) unsafe fn init() {
    // SAFETY: by this function's requirement.
    unsafe { MAPPED.init() };
}

/// Releases the held inodes at module unload (no file, hence no window, is
/// left then).
pub(crate) fn release_inodes() {
    let mut mapped = MAPPED.lock();
    for &inode in mapped.0.iter() {
        // SAFETY: held by `ihold` in `mmap`, released once here.
        unsafe { bindings::iput(inode as *mut bindings::inode) };
    }
    mapped.0.clear();
}

/// Zaps every window of device `index` in every process (unbind, removal).
/// Called after the device is marked gone, so no new window appears.
pub(crate) fn zap_device(index: u32) {
    let mapped = MAPPED.lock();
    for &inode in mapped.0.iter() {
        // SAFETY: the inode is held (`ihold`), so its address space lives;
        // the range is exactly the offsets of this device's windows.
        unsafe {
            bindings::unmap_mapping_range(
                (*(inode as *mut bindings::inode)).i_mapping,
                mmap_offset(index, 0) as i64,
                1i64 << INDEX_SHIFT,
                1,
            )
        };
    }
}

/// Maps the window the VMA's offset names, or refuses: `ENOENT` (no such
/// device), `ENODEV` (gone), `EINVAL` (no such BAR, not a mappable memory
/// BAR, the window passes the BAR's end, or a private mapping), `EPERM`.
pub(crate) fn mmap(vma: &VmaNew, offset: u64) -> Result {
    require_sys_admin()?;
    // A private mapping would have its offset rewritten (COW), and the
    // window could then not be zapped by offset.
    if vma.flags() & flags::SHARED == 0 {
        return Err(EINVAL);
    }
    // Held across the state check and the remap: `zap_device` after a
    // device is marked gone cannot miss a window made before.
    let mut mapped = MAPPED.lock();
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
    kernel::error::to_result(ret)?;
    // SAFETY: a VMA under construction of a file of this misc device: its
    // file and the file's mapping and inode are live.
    let inode = unsafe { (*(*(*vma.as_ptr()).vm_file).f_mapping).host } as usize;
    if !mapped.0.contains(&inode) {
        mapped.0.push(inode, GFP_KERNEL)?;
        // SAFETY: `inode` is live (above); released in `release_inodes`.
        unsafe { bindings::ihold(inode as *mut bindings::inode) };
    }
    Ok(())
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
