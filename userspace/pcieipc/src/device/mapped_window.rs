//! Windows of a BAR or of a DMA buffer, mapped into this process.

use std::{num::NonZeroUsize, os::fd::AsFd, ptr::NonNull};

use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use pcieipc_uapi as uapi;

use super::node::{Device, DeviceError};

/// A mapped range of a BAR or DMA buffer, unmapped on drop. Accesses are
/// volatile: the memory is device memory, or memory that a device or
/// another peer writes concurrently.
#[derive(Debug)]
pub struct MappedWindow {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the window is plain mapped memory with no thread affinity; every
// access goes through volatile reads and writes of `&self`.
unsafe impl Send for MappedWindow {}
// SAFETY: as above.
unsafe impl Sync for MappedWindow {}

impl MappedWindow {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start of the window, for callers that do their own accesses.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Copies `data` into the window at `offset`.
    ///
    /// # Panics
    /// If the range passes the window's end.
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset
            .checked_add(data.len())
            .is_some_and(|end| end <= self.len));
        for (i, &byte) in data.iter().enumerate() {
            // SAFETY: in bounds (checked above) of a live mapping.
            unsafe { self.ptr.as_ptr().add(offset + i).write_volatile(byte) };
        }
    }

    /// Copies from the window at `offset` into `out`.
    ///
    /// # Panics
    /// If the range passes the window's end.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(offset
            .checked_add(out.len())
            .is_some_and(|end| end <= self.len));
        for (i, byte) in out.iter_mut().enumerate() {
            // SAFETY: in bounds (checked above) of a live mapping.
            *byte = unsafe { self.ptr.as_ptr().add(offset + i).read_volatile() };
        }
    }
}

impl Drop for MappedWindow {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + len` is the mapping made in `map_bar`, and no
        // reference into it outlives `self`.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

impl Device {
    /// Maps `len` bytes at file offset `file_offset` (shared, read-write).
    pub(crate) fn map(
        &self,
        file_offset: u64,
        len: usize,
    ) -> Result<MappedWindow, nix::errno::Errno> {
        let length = NonZeroUsize::new(len).ok_or(nix::errno::Errno::EINVAL)?;
        let file_offset = i64::try_from(file_offset).map_err(|_| nix::errno::Errno::EINVAL)?;
        // SAFETY: a new shared mapping of the device file at an address the
        // kernel picks: no existing memory is affected.
        let ptr = unsafe {
            mmap(
                None,
                length,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                self.file.as_fd(),
                file_offset,
            )
        }?;
        Ok(MappedWindow {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Maps `len` bytes of BAR `bar` of device `device`, from `offset` (a
    /// multiple of the page size) into the BAR. The module refuses ranges
    /// past the BAR's end and BARs that are not mappable memory (EINVAL).
    pub fn map_bar(
        &self,
        device: u32,
        bar: u32,
        offset: u64,
        len: usize,
    ) -> Result<MappedWindow, DeviceError> {
        let error = |errno| DeviceError::Mmap {
            path: self.path.clone(),
            device,
            bar,
            offset,
            len,
            errno,
        };
        let file_offset = uapi::mmap_offset(device, bar)
            .checked_add(offset)
            .ok_or_else(|| error(nix::errno::Errno::EINVAL))?;
        self.map(file_offset, len).map_err(error)
    }
}
