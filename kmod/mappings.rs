// SPDX-License-Identifier: GPL-2.0

//! What userspace can map of the module: the one address space that every
//! file of /dev/pcieipc maps through (a `MappingInode` the module owns, as
//! VFIO owns its devices' inodes), and every DMA buffer, by key.
//!
//! One lock covers both. Faults insert pages under it; a device that goes
//! and a file that is released remove their buffers and zap the pages under
//! it. So a page is never left mapped after its memory is freed or its
//! device is gone, whatever the order of faults, mmaps and unbinds.
//!
//! A window whose memory went away with its device (a BAR window, a DMA
//! buffer freed when its device went) maps the module's stand-in page
//! instead when it is touched again, rather than killing the process with
//! SIGBUS: a rank of an all-reduce must live to name the device it lost
//! (DEVICE_GONE, queued before the memory goes), and a library cannot own
//! its process's SIGBUS handler (Python, PyTorch and CUDA install their
//! own), so the kernel, which knows which mappings are gone, does it. One
//! zeroed page for the whole module, allocated at load and freed at unload
//! (when no file is open, so nothing maps it): what it reads is
//! meaningless, and what is written to it reaches no device; only
//! CAP_SYS_ADMIN processes map windows.
//!
//! A buffer's key is its handle and names its mmap offset
//! (`PCIEIPC_MMAP_DMA | key << PCIEIPC_MMAP_BAR_SHIFT`); keys are never
//! reused while the module is loaded, so a stale handle or mapping cannot
//! reach another file's buffer.

use kernel::{fs::File, page::Page, prelude::*, sync::Arc};

use crate::{
    bound_device::BoundDevice,
    dma_buffer::DmaBuffer,
    uapi,
    user_mapping::{FaultMapped, Inserted, MappingInode, PageInsert},
};

const KEY_SHIFT: u32 = uapi::PCIEIPC_MMAP_BAR_SHIFT;
/// Keys fit between the key shift and the PCIEIPC_MMAP_DMA bit.
const KEY_LIMIT: u32 = 1 << (62 - KEY_SHIFT);
const IN_BUFFER_MASK: u64 = (1 << KEY_SHIFT) - 1;

struct DmaEntry {
    key: u32,
    /// The file that allocated it (`attach`'s id).
    file: u64,
    /// Declared before `buffer`, so dropped first: the device's bus
    /// mastering follows its buffers and ends before their memory goes.
    _mastering: BufferOfDevice,
    buffer: Arc<DmaBuffer>,
}

/// A DMA buffer counted against its device while it lives
/// (`BoundDevice::buffer_changed`).
struct BufferOfDevice(Arc<BoundDevice>);

impl BufferOfDevice {
    fn new(device: &Arc<BoundDevice>) -> Self {
        device.buffer_changed(true);
        BufferOfDevice(device.clone())
    }
}

impl Drop for BufferOfDevice {
    fn drop(&mut self) {
        self.0.buffer_changed(false);
    }
}

pub(crate) struct Mappings {
    /// Set by `init`, dropped by `exit`.
    inode: Option<MappingInode>,
    /// The stand-in page; set by `init`, freed by `exit`.
    stand_in: Option<Page>,
    buffers: KVec<DmaEntry>,
    next_key: u32,
    next_file: u64,
}

kernel::sync::global_lock! {
    // SAFETY: initialised by `init` in the module initialiser, before the
    // misc device exists.
    unsafe(uninit) static MAPPINGS: Mutex<Mappings> = Mappings {
        inode: None,
        stand_in: None,
        buffers: KVec::new(),
        next_key: 0,
        next_file: 0,
    };
}

/// Creates the address space.
///
/// # Safety
///
/// Called once, before any other function of this module.
pub(crate) unsafe fn init() -> Result {
    // SAFETY: by this function's requirement.
    unsafe { MAPPINGS.init() };
    let mut mappings = MAPPINGS.lock();
    mappings.stand_in = Some(Page::alloc_page(GFP_KERNEL | __GFP_ZERO)?);
    mappings.inode = Some(MappingInode::new()?);
    Ok(())
}

/// Releases the address space at module unload (no file is open then, so
/// nothing is mapped and no buffer is left).
pub(crate) fn exit() {
    let mut mappings = MAPPINGS.lock();
    mappings.buffers.clear();
    mappings.inode = None;
    mappings.stand_in = None;
}

/// Makes `file` (being opened) map through the module's address space;
/// returns the file's id, which owns its DMA buffers.
pub(crate) fn attach(file: &File) -> Result<u64> {
    let mut mappings = MAPPINGS.lock();
    mappings.inode.as_ref().ok_or(ENODEV)?.attach(file);
    let id = mappings.next_file;
    mappings.next_file += 1;
    Ok(id)
}

/// Frees the DMA buffers of file `id` (being released: its mappings are
/// gone, each held the file open) and points it back at its own inode.
pub(crate) fn release(file: &File, id: u64) {
    let mut mappings = MAPPINGS.lock();
    MappingInode::detach(file);
    // A transfer still in flight holds its buffers, and frees them at its end.
    free_buffers(&mut mappings, |entry| entry.file == id);
}

/// Zaps the file offsets `[start, start + len)` in every process. A BAR
/// window's owner calls it after marking its device gone, and refuses the
/// faults that follow.
pub(crate) fn zap(start: u64, len: u64) {
    if let Some(inode) = &MAPPINGS.lock().inode {
        inode.zap(start, len);
    }
}

/// Where a touched page of a window comes from.
pub(crate) enum Backing {
    /// This page frame.
    Frame(u64),
    /// The window's memory went away with its device: the stand-in page.
    Gone,
    /// Nothing now: the access faults again (a reset is in progress).
    Retry,
}

/// Inserts the page `backing` names, deciding and inserting under the lock
/// that `zap` takes: a page is either inserted before a zap (which removes
/// it) or decided after the state the zap follows.
pub(crate) fn insert_page(
    insert: PageInsert<'_>,
    backing: impl FnOnce(&Mappings) -> Result<Backing>,
) -> Result<Inserted> {
    let mappings = MAPPINGS.lock();
    match backing(&mappings)? {
        Backing::Frame(pfn) => Ok(insert.insert(pfn)),
        Backing::Gone => {
            let page = mappings.stand_in.as_ref().ok_or(ENODEV)?;
            Ok(insert.insert_ram(page))
        }
        Backing::Retry => Ok(insert.retry()),
    }
}

/// The mmap offset of DMA buffer `key`.
pub(crate) fn dma_mmap_offset(key: u32) -> u64 {
    uapi::PCIEIPC_MMAP_DMA | (u64::from(key) << KEY_SHIFT)
}

/// The buffer key and the offset inside it that a DMA mmap offset names.
pub(crate) fn decode_dma_offset(offset: u64) -> Result<(u32, u64)> {
    let within = offset & !uapi::PCIEIPC_MMAP_DMA;
    let key = u32::try_from(within >> KEY_SHIFT).map_err(|_| EINVAL)?;
    Ok((key, within & IN_BUFFER_MASK))
}

/// Adds a buffer of file `file` for `device`; returns its key. ENOSPC when
/// the file has PCIEIPC_DMA_MAX_BUFFERS, or when the module has used up its
/// keys; the device's errno when it is no longer usable (checked under the
/// lock `device_gone` takes, so a buffer never outlives its device here).
pub(crate) fn add_buffer(file: u64, device: &Arc<BoundDevice>, buffer: DmaBuffer) -> Result<u32> {
    let mut mappings = MAPPINGS.lock();
    device.check_usable()?;
    let owned = mappings.buffers.iter().filter(|e| e.file == file).count();
    if owned >= uapi::PCIEIPC_DMA_MAX_BUFFERS as usize || mappings.next_key >= KEY_LIMIT {
        return Err(ENOSPC);
    }
    let key = mappings.next_key;
    let entry = DmaEntry {
        key,
        file,
        buffer: Arc::new(buffer, GFP_KERNEL)?,
        _mastering: BufferOfDevice::new(device),
    };
    mappings.buffers.push(entry, GFP_KERNEL)?;
    mappings.next_key += 1;
    Ok(key)
}

/// Buffer `key` of file `file` (ENOENT: none, another file's, or freed
/// because its device went).
pub(crate) fn buffer(file: u64, key: u32) -> Result<Arc<DmaBuffer>> {
    MAPPINGS
        .lock()
        .buffers
        .iter()
        .find(|e| e.key == key && e.file == file)
        .map(|e| e.buffer.clone())
        .ok_or(ENOENT)
}

/// Checks that `[offset, offset + len)` lies in buffer `key` of file
/// `file` (ENOENT: no such buffer of the file; EINVAL: outside it), without
/// taking a reference that could outlive the buffer's device.
pub(crate) fn check_window(file: u64, key: u32, offset: u64, len: u64) -> Result {
    let mappings = MAPPINGS.lock();
    let entry = mappings
        .buffers
        .iter()
        .find(|e| e.key == key && e.file == file)
        .ok_or(ENOENT)?;
    if entry.buffer.contains(offset, len) {
        Ok(())
    } else {
        Err(EINVAL)
    }
}

/// Frees the DMA buffers of device `index` (gone: its copy engine stopped
/// and bus mastering cleared), after zapping their pages in every process:
/// a later access maps the stand-in page.
pub(crate) fn device_gone(index: u32) {
    free_buffers(&mut MAPPINGS.lock(), |entry| {
        entry.buffer.device_index == index
    });
}

/// Frees the buffers `which` selects, each after zapping its pages.
fn free_buffers(mappings: &mut Mappings, which: impl Fn(&DmaEntry) -> bool) {
    let Mappings { inode, buffers, .. } = mappings;
    buffers.retain(|entry| {
        let free = which(entry);
        if let (true, Some(inode)) = (free, inode.as_ref()) {
            inode.zap(dma_mmap_offset(entry.key), 1 << KEY_SHIFT);
        }
        !free
    });
}

/// The userspace mappings of DMA buffers.
pub(crate) struct DmaWindows;

impl FaultMapped for DmaWindows {
    const UNCACHED: bool = false;

    fn fault(offset: u64, insert: PageInsert<'_>) -> Result<Inserted> {
        let (key, in_buffer) = decode_dma_offset(offset)?;
        insert_page(insert, |mappings| {
            // mmap checked the key, and the mapping holds its file open: a
            // key no longer listed is a buffer freed because its device went.
            let Some(entry) = mappings.buffers.iter().find(|e| e.key == key) else {
                return Ok(Backing::Gone);
            };
            let pfn = entry.buffer.page_frame(in_buffer).ok_or(EFAULT)?;
            Ok(Backing::Frame(pfn))
        })
    }
}
