// SPDX-License-Identifier: GPL-2.0

//! Device memory and DMA buffers mapped into userspace, and taken back.
//!
//! 7.3's `mm::virt` cannot map page frames from a fault handler, read a
//! VMA's file offset, point a file at an address space of the driver's, or
//! zap a file's pages by offset in every process. This is the one place that
//! does those through the raw bindings (with `pgprot_noncached` from
//! helpers.c and the pseudo filesystem of mapping_inode.c).
//!
//! Pages are mapped at fault time, as VFIO does: mmap only checks the
//! request and installs the fault handler, so a page exists only in a VMA
//! that is already linked into the file's address space, where a zap finds
//! it. A fault asks the region's owner for the page under the lock the owner
//! holds around a zap: the page is inserted before the zap (which then
//! removes it), or after it the owner answers for memory that went away
//! (the module's stand-in page: `mappings`).

use core::{ffi::c_void, marker::PhantomData, ptr::NonNull};

use kernel::{
    bindings,
    fs::File,
    mm::virt::{flags, VmaNew},
    page::{Page, PAGE_SHIFT},
    prelude::*,
};

extern "C" {
    /// `pgprot_noncached` (helpers.c).
    fn pcieipc_pgprot_noncached(prot: bindings::pgprot_t) -> bindings::pgprot_t;
    // `struct inode`, `vm_area_struct` and `page` are passed as `void *`:
    // they hold fields of types that bindgen leaves empty, which Rust calls
    // unsafe to pass to C.
    /// Maps RAM page `page` cached at `address` of VM_PFNMAP `vma` (helpers.c).
    fn pcieipc_insert_ram_page(
        vma: *mut c_void,
        address: usize,
        page: *mut c_void,
    ) -> bindings::vm_fault_t;
    /// A new inode on the module's pseudo filesystem, or an ERR_PTR
    /// (mapping_inode.c).
    fn pcieipc_mapping_inode_new() -> *mut c_void;
    /// Releases that inode and the filesystem (mapping_inode.c).
    fn pcieipc_mapping_inode_put(inode: *mut c_void);
}

/// The file offset of `vma` (a VMA under construction), or EINVAL when it
/// does not fit 64 bits.
pub(crate) fn file_offset(vma: &VmaNew) -> Result<u64> {
    // SAFETY: `vma` is a VMA under construction; `vm_pgoff` is plain data.
    let pgoff = unsafe { (*vma.as_ptr()).vm_pgoff } as u64;
    page_offset(pgoff).ok_or(EINVAL)
}

/// The byte offset of page offset `pgoff`, if it fits 64 bits.
fn page_offset(pgoff: u64) -> Option<u64> {
    let offset = pgoff.checked_shl(PAGE_SHIFT as u32)?;
    (offset >> PAGE_SHIFT == pgoff).then_some(offset)
}

/// The inode whose address space holds every mapping of the module's files
/// (each file is attached to it at open), owned by the module.
///
/// # Invariants
///
/// `inode` is an inode of `pcieipc_mapping_inode_new`, released only in
/// `drop`.
pub(crate) struct MappingInode {
    inode: NonNull<bindings::inode>,
}

// SAFETY: the inode may be used and released from any thread; `zap` and
// `attach` only read it (the mm core locks its address space).
unsafe impl Send for MappingInode {}
// SAFETY: as above.
unsafe impl Sync for MappingInode {}

impl MappingInode {
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: no requirement; the result is an inode or an ERR_PTR.
        let inode = kernel::error::from_err_ptr(unsafe { pcieipc_mapping_inode_new() })?;
        let inode = inode.cast::<bindings::inode>();
        // INVARIANT: a new inode, released in `drop`.
        Ok(Self {
            inode: NonNull::new(inode).ok_or(ENOMEM)?,
        })
    }

    /// Makes `file` (being opened) map through this inode's address space.
    pub(crate) fn attach(&self, file: &File) {
        // SAFETY: `file` is being opened, so no other thread uses it yet
        // (VFIO sets f_mapping at open the same way); the inode is live
        // (invariant), and so is its address space.
        unsafe { (*file.as_ptr()).f_mapping = (*self.inode.as_ptr()).i_mapping };
    }

    /// Points `file` (being released: none of its mappings is left) back at
    /// its own inode's address space, before this inode may go.
    pub(crate) fn detach(file: &File) {
        // SAFETY: `file` is being released, so no other thread uses it; its
        // own inode lives as long as the file.
        unsafe {
            let raw = file.as_ptr();
            (*raw).f_mapping = (*(*raw).f_inode).i_mapping;
        }
    }

    /// Unmaps the pages at file offsets `[start, start + len)` in every
    /// process; a later access faults in again (and is refused if the
    /// region's owner no longer has the page).
    pub(crate) fn zap(&self, start: u64, len: u64) {
        // SAFETY: the inode is live (invariant), so its address space lives.
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

impl Drop for MappingInode {
    fn drop(&mut self) {
        // SAFETY: the inode of `new` (invariant), released once.
        unsafe { pcieipc_mapping_inode_put(self.inode.as_ptr().cast()) };
    }
}

/// Where the pages of a fault-mapped region come from.
pub(crate) trait FaultMapped {
    /// Device memory (mapped uncached) rather than RAM.
    const UNCACHED: bool;

    /// Inserts the page at file offset `offset` (page aligned) with
    /// `insert`, holding the lock under which the region's owner zaps it, or
    /// fails (the access gets SIGBUS: an offset the region never had;
    /// ENOMEM: out of memory).
    fn fault(offset: u64, insert: PageInsert<'_>) -> Result<Inserted>;
}

/// The one page a fault may insert.
pub(crate) struct PageInsert<'fault> {
    vma: *mut bindings::vm_area_struct,
    address: usize,
    _fault: PhantomData<&'fault bindings::vm_fault>,
}

/// What inserting a page returned to the mm core.
pub(crate) struct Inserted(bindings::vm_fault_t);

impl PageInsert<'_> {
    /// Maps page frame `pfn` at the faulting address.
    pub(crate) fn insert(self, pfn: u64) -> Inserted {
        // SAFETY: `vma` is the faulting VMA of a fault in progress (its mmap
        // lock is held), set up by `install_fault_handler` as VM_PFNMAP and
        // shared; `address` is the faulting address inside it.
        Inserted(unsafe { bindings::vmf_insert_pfn(self.vma, self.address, pfn as usize) })
    }

    /// Inserts nothing: the access faults again when the process goes on
    /// (after the signal it was woken by, if any).
    pub(crate) fn retry(self) -> Inserted {
        Inserted(bindings::vm_fault_reason_VM_FAULT_NOPAGE)
    }

    /// Maps `page`, RAM the module owns, at the faulting address, cached
    /// whatever the region's own memory is: the caller keeps `page` until
    /// no mapping of the module is left (module unload).
    pub(crate) fn insert_ram(self, page: &Page) -> Inserted {
        // SAFETY: as in `insert`; `page` is a live page the module owns.
        Inserted(unsafe {
            pcieipc_insert_ram_page(self.vma.cast(), self.address, page.as_ptr().cast())
        })
    }
}

/// The fault handler of a region of kind `T`.
///
/// # Safety
///
/// Called by the mm core with a live `vm_fault` of a VMA that
/// `install_fault_handler::<T>` set up.
unsafe extern "C" fn fault<T: FaultMapped>(vmf: *mut bindings::vm_fault) -> bindings::vm_fault_t {
    // SAFETY: `vmf` is live for the call (this function's requirement).
    let (vma, pgoff, address) = unsafe {
        let fault = &(*vmf).__bindgen_anon_1;
        (fault.vma, fault.pgoff, fault.address)
    };
    let Some(offset) = page_offset(pgoff as u64) else {
        return bindings::vm_fault_reason_VM_FAULT_SIGBUS;
    };
    let insert = PageInsert {
        vma,
        address,
        _fault: PhantomData,
    };
    match T::fault(offset, insert) {
        Ok(Inserted(code)) => code,
        Err(e) if e == ENOMEM => bindings::vm_fault_reason_VM_FAULT_OOM,
        Err(_) => bindings::vm_fault_reason_VM_FAULT_SIGBUS,
    }
}

struct FaultOps<T>(PhantomData<T>);

impl<T: FaultMapped> FaultOps<T> {
    const OPS: bindings::vm_operations_struct = bindings::vm_operations_struct {
        fault: Some(fault::<T>),
        // SAFETY: all-zero is a valid `vm_operations_struct`: every other
        // callback absent.
        ..unsafe { core::mem::zeroed() }
    };
}

/// Makes `vma` (a shared VMA under construction) a region of kind `T`:
/// VM_IO | VM_PFNMAP (the core never treats its pages as RAM it manages),
/// not expandable by mremap, not copied on fork, not dumped; its pages come
/// from `T::fault`.
pub(crate) fn install_fault_handler<T: FaultMapped>(vma: &VmaNew) -> Result {
    // vmf_insert_pfn refuses copy-on-write mappings of VM_PFNMAP VMAs.
    if vma.flags() & flags::SHARED == 0 {
        return Err(EINVAL);
    }
    let set = flags::IO | flags::PFNMAP | flags::DONTEXPAND | flags::DONTCOPY | flags::DONTDUMP;
    // SAFETY: `vma` is under construction, not yet visible to any other
    // thread (`VmaNew` is `!Sync`): writing its flags, protection and
    // operations is not a race; the flags set are the ones
    // `remap_pfn_range` sets, and the operations are 'static.
    unsafe {
        let raw = vma.as_ptr();
        (*raw).__bindgen_anon_2.vm_flags |= set;
        if T::UNCACHED {
            (*raw).vm_page_prot = pcieipc_pgprot_noncached((*raw).vm_page_prot);
        }
        (*raw).vm_ops = &FaultOps::<T>::OPS;
    }
    Ok(())
}
