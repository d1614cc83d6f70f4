// SPDX-License-Identifier: GPL-2.0

//! Device memory mapped into userspace, and taken back.
//!
//! 7.3's `mm::virt` has no way to remap device memory into a VMA, to read a
//! VMA's file offset, or to zap the pages of a file by offset in every
//! process that maps it. This is the one place that does those through the
//! raw bindings (and `pgprot_noncached`, through helpers.c).

use core::ptr::NonNull;

use kernel::{bindings, mm::virt::VmaNew, page::PAGE_SHIFT, prelude::*};

extern "C" {
    /// `pgprot_noncached` (helpers.c).
    fn pcieipc_pgprot_noncached(prot: bindings::pgprot_t) -> bindings::pgprot_t;
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

/// Maps the physical range `[phys, phys + len)` into all of `vma`, uncached.
/// `remap_pfn_range` marks the VMA VM_IO | VM_PFNMAP, so the core never
/// treats these pages as RAM.
///
/// # Safety
///
/// `[phys, phys + len)` is device memory (a memory BAR) that the caller owns
/// for as long as the mapping can exist, page aligned, and `len` is the
/// VMA's length.
pub(crate) unsafe fn remap_uncached(vma: &VmaNew, phys: u64, len: usize) -> Result {
    // SAFETY: `vma` is a VMA under construction whose pages are not mapped
    // yet; the range is device memory the caller owns (this function's
    // requirements).
    let ret = unsafe {
        let raw = vma.as_ptr();
        (*raw).vm_page_prot = pcieipc_pgprot_noncached((*raw).vm_page_prot);
        bindings::remap_pfn_range(
            raw,
            vma.start(),
            (phys >> PAGE_SHIFT) as usize,
            len,
            (*raw).vm_page_prot,
        )
    };
    kernel::error::to_result(ret)
}

/// The inode of a mapped file, held (`ihold`) until dropped: its address
/// space holds every mapping of the file, by file offset, in every process.
///
/// # Invariants
///
/// `inode` points to an inode on which this value holds a reference.
pub(crate) struct HeldInode {
    inode: NonNull<bindings::inode>,
}

// SAFETY: a held inode may be used and released from any thread.
unsafe impl Send for HeldInode {}
// SAFETY: `zap` and `maps` may run concurrently (the mm core locks).
unsafe impl Sync for HeldInode {}

impl HeldInode {
    /// The inode of the file `vma` maps, or `None` for an anonymous VMA.
    fn inode_of(vma: &VmaNew) -> Option<NonNull<bindings::inode>> {
        // SAFETY: `vma` is a VMA under construction; `vm_file` is plain data.
        let file = unsafe { (*vma.as_ptr()).vm_file };
        if file.is_null() {
            return None;
        }
        // SAFETY: the file of a VMA under construction is open for the call,
        // and an open file's mapping and its host inode are live.
        NonNull::new(unsafe { (*(*file).f_mapping).host })
    }

    /// Holds the inode of the file `vma` maps.
    pub(crate) fn hold(vma: &VmaNew) -> Result<Self> {
        let inode = Self::inode_of(vma).ok_or(EINVAL)?;
        // SAFETY: `inode` is live (above); the reference is released in `drop`.
        unsafe { bindings::ihold(inode.as_ptr()) };
        // INVARIANT: the reference was just taken.
        Ok(Self { inode })
    }

    /// Whether `vma` maps this inode's file.
    pub(crate) fn maps(&self, vma: &VmaNew) -> bool {
        Self::inode_of(vma) == Some(self.inode)
    }

    /// Unmaps the pages at file offsets `[start, start + len)` in every
    /// process; a later access faults (SIGBUS: no `fault` handler).
    pub(crate) fn zap(&self, start: u64, len: u64) {
        // SAFETY: the inode is held (invariant), so its address space lives.
        unsafe {
            bindings::unmap_mapping_range(
                (*self.inode.as_ptr()).i_mapping,
                start as i64,
                len as i64,
                1,
            )
        };
    }
}

impl Drop for HeldInode {
    fn drop(&mut self) {
        // SAFETY: this value holds one reference (invariant), released once.
        unsafe { bindings::iput(self.inode.as_ptr()) };
    }
}
