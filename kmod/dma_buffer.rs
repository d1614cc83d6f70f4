// SPDX-License-Identifier: GPL-2.0

//! Coherent DMA buffers allocated from an ioctl.
//!
//! 7.3's `dma::Coherent` needs a `&Device<Bound>` at allocation, which an
//! ioctl (a 'static context) does not have; the buffer only needs the
//! `struct device` alive, which an `ARef` guarantees. This file is the one
//! place that calls `dma_alloc_attrs`/`dma_free_attrs`, and that finds the
//! page frames of a buffer for its userspace mapping (user_mapping.rs maps
//! them at fault time).

use core::ptr::NonNull;

use kernel::{bindings, io::Io, page::PAGE_SIZE, pci, prelude::*, sync::aref::ARef};

use crate::pci_info::raw_device;

extern "C" {
    /// The page frame behind an address `dma_alloc_attrs` returned
    /// (helpers.c).
    fn pcieipc_kernel_address_pfn(addr: *const core::ffi::c_void) -> core::ffi::c_ulong;
}

/// A zeroed coherent buffer of one device.
pub(crate) struct DmaBuffer {
    dev: ARef<pci::Device>,
    cpu: NonNull<u8>,
    bus: u64,
    size: usize,
    /// The index of the device (registry) it was allocated for.
    pub(crate) device_index: u32,
}

// SAFETY: the buffer is plain memory; concurrent accesses go through raw
// pointers (the device and userspace write it concurrently anyway).
unsafe impl Send for DmaBuffer {}
// SAFETY: as above; `&DmaBuffer` gives no reference into the memory.
unsafe impl Sync for DmaBuffer {}

impl DmaBuffer {
    /// Allocates `size` bytes (rounded up to pages) for `dev`.
    pub(crate) fn alloc(dev: ARef<pci::Device>, device_index: u32, size: usize) -> Result<Self> {
        let size = size.checked_next_multiple_of(PAGE_SIZE).ok_or(EINVAL)?;
        let mut bus: bindings::dma_addr_t = 0;
        // __GFP_NOWARN: a size the allocator cannot serve is the caller's
        // ENOMEM, not a warning in the kernel log (a crash with
        // panic_on_warn). Without a CMA area (Debian's kernels reserve none
        // unless booted with `cma=`) a buffer above the buddy allocator's
        // largest order (4 MiB on x86) always fails so.
        // SAFETY: `dev` is a live device (the ARef holds it); the coherent
        // mask was set at probe (PCI devices default to 32 bits).
        let cpu = unsafe {
            bindings::dma_alloc_attrs(
                raw_device(&dev),
                size,
                &mut bus,
                bindings::GFP_KERNEL | bindings::__GFP_ZERO | bindings::__GFP_NOWARN,
                0,
            )
        };
        let cpu = NonNull::new(cpu.cast::<u8>()).ok_or(ENOMEM)?;
        Ok(Self {
            dev,
            cpu,
            bus,
            size,
            device_index,
        })
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The address the device uses.
    pub(crate) fn bus_addr(&self) -> u64 {
        self.bus
    }

    /// Whether `[offset, offset + len)` lies inside the buffer.
    pub(crate) fn contains(&self, offset: u64, len: u64) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.size as u64)
    }

    /// Copies `len` bytes from `src` at `src_offset` to `self` at
    /// `dst_offset` with the CPU; both ranges checked by the caller.
    pub(crate) fn copy_from(
        &self,
        dst_offset: usize,
        src: &DmaBuffer,
        src_offset: usize,
        len: usize,
    ) {
        if !self.contains(dst_offset as u64, len as u64)
            || !src.contains(src_offset as u64, len as u64)
        {
            return;
        }
        // SAFETY: both ranges lie inside live allocations (checked above);
        // `copy` allows them to overlap (the same buffer).
        unsafe {
            core::ptr::copy(
                src.cpu.as_ptr().add(src_offset),
                self.cpu.as_ptr().add(dst_offset),
                len,
            )
        };
    }

    /// Copies `len` bytes between the buffer at `offset` and the BAR window
    /// `bar` at `bar_offset`, in the direction `to_bar`, with the CPU (32-bit
    /// accesses where aligned). Ranges are checked here and by the BAR.
    pub(crate) fn copy_with_bar(
        &self,
        offset: usize,
        bar: &pci::Bar<'_>,
        bar_offset: usize,
        len: usize,
        to_bar: bool,
    ) -> Result {
        if !self.contains(offset as u64, len as u64) {
            return Err(EINVAL);
        }
        let base = self.cpu.as_ptr();
        let mut done = 0;
        while done < len {
            let io = bar_offset + done;
            // SAFETY: `offset + done < offset + len <= size` (checked above):
            // the pointer stays inside the buffer. It is read or written as a
            // `u32` only when `len - done >= 4`, i.e. when all four bytes are
            // inside the range; unaligned raw accesses are allowed.
            let word = unsafe { base.add(offset + done) }.cast::<u32>();
            if io % 4 == 0 && len - done >= 4 {
                if to_bar {
                    // SAFETY: see above.
                    bar.try_write32(unsafe { word.read_unaligned() }, io)?;
                } else {
                    let value = bar.try_read32(io)?;
                    // SAFETY: see above.
                    unsafe { word.write_unaligned(value) };
                }
                done += 4;
            } else {
                // SAFETY: `offset + done < offset + len`: inside the buffer.
                let byte = unsafe { base.add(offset + done) };
                if to_bar {
                    // SAFETY: see above.
                    bar.try_write8(unsafe { byte.read() }, io)?;
                } else {
                    let value = bar.try_read8(io)?;
                    // SAFETY: see above.
                    unsafe { byte.write(value) };
                }
                done += 1;
            }
        }
        Ok(())
    }

    /// The page frame of the page at `offset` (page aligned) inside the
    /// buffer, for a fault of its userspace mapping.
    pub(crate) fn page_frame(&self, offset: u64) -> Option<u64> {
        if !self.contains(offset, PAGE_SIZE as u64) {
            return None;
        }
        // SAFETY: `offset + PAGE_SIZE <= size` (checked above): the address
        // lies inside the allocation that `dma_alloc_attrs` returned.
        let pfn =
            unsafe { pcieipc_kernel_address_pfn(self.cpu.as_ptr().add(offset as usize).cast()) };
        Some(pfn)
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc` with these arguments; no transfer
        // refers to it any more (a transfer holds the buffer alive), and its
        // owner zapped every userspace mapping of it first (mappings.rs).
        unsafe {
            bindings::dma_free_attrs(
                raw_device(&self.dev),
                self.size,
                self.cpu.as_ptr().cast(),
                self.bus,
                0,
            )
        };
    }
}
