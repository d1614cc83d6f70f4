// SPDX-License-Identifier: GPL-2.0

//! mmap of BAR windows: the file offset names (device index, BAR, offset in
//! the BAR), as VFIO's region offsets do; the window is remapped uncached.
//! The driver zaps a device's windows when it goes away (a later access gets
//! SIGBUS instead of reaching a BAR the module no longer owns).

use kernel::{
    mm::virt::{flags, VmaNew},
    prelude::*,
};

use crate::{
    capability::require_sys_admin,
    registry, uapi,
    user_mapping::{self, HeldInode},
};

const BAR_SHIFT: u32 = uapi::PCIEIPC_MMAP_BAR_SHIFT;
const INDEX_SHIFT: u32 = uapi::PCIEIPC_MMAP_INDEX_SHIFT;

/// `PCIEIPC_MMAP_OFFSET(index, bar)`.
pub(crate) fn mmap_offset(index: u32, bar: u32) -> u64 {
    (u64::from(index) << INDEX_SHIFT) | (u64::from(bar) << BAR_SHIFT)
}

/// The inodes (device nodes of /dev/pcieipc) that BAR windows were mapped
/// through, each held until the module unloads: their address spaces hold
/// every window, by file offset.
pub(crate) struct MappedInodes(KVec<HeldInode>);

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
    MAPPED.lock().0.clear();
}

/// Zaps every window of device `index` in every process (unbind, removal).
/// Called after the device is marked gone, so no new window appears.
pub(crate) fn zap_device(index: u32) {
    let mapped = MAPPED.lock();
    for inode in mapped.0.iter() {
        inode.zap(mmap_offset(index, 0), 1u64 << INDEX_SHIFT);
    }
}

/// Maps the window the VMA's offset names, or refuses: `ENOENT` (no such
/// device), `ENODEV` (gone), `EINVAL` (no such BAR, not a mappable memory
/// BAR, the window passes the BAR's end, or a private mapping), `EPERM`.
pub(crate) fn mmap(vma: &VmaNew, offset: u64) -> Result {
    require_sys_admin()?;
    crate::capability::require_pci_access()?;
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
    // Room first: once mapped, the window must be zappable.
    let held = if mapped.0.iter().any(|inode| inode.maps(vma)) {
        None
    } else {
        mapped.0.reserve(1, GFP_KERNEL)?;
        Some(HeldInode::hold(vma)?)
    };
    vma.set_dontcopy();
    // SAFETY: the range lies inside a memory BAR of a bound device (checked
    // above, under `MAPPED`, so `zap_device` unmaps it when the device goes,
    // before its regions are released); it is page aligned (BARs of at least
    // a page are aligned to their size; `in_bar` and `len` are page
    // multiples), and `len` is the VMA's length.
    unsafe { user_mapping::remap_uncached(vma, info.start + in_bar, len as usize) }?;
    if let Some(held) = held {
        mapped.0.push_within_capacity(held).map_err(|_| ENOMEM)?;
    }
    Ok(())
}
