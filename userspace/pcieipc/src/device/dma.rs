//! DMA buffers and copies: DMA_ALLOC, DMA_COPY, DMA_WAIT.

use std::{os::fd::AsRawFd, time::Duration};

use nix::errno::Errno;
use pcieipc_uapi as uapi;

use super::mapped_window::MappedWindow;
use super::node::{Device, DeviceError};

/// A coherent DMA buffer of a device, owned by the open `Device` (freed when
/// it is closed and every window of it is unmapped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaBuffer {
    /// The device it was allocated for.
    pub device: u32,
    pub handle: u32,
    /// Bytes (the request rounded up to pages).
    pub size: u64,
    /// The address the device uses.
    pub bus_addr: u64,
    pub mmap_offset: u64,
}

/// Who executed a copy (`pcieipc_dma_engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DmaEngine {
    Cpu,
    Edu,
}

/// A submitted copy: wait for it with `Device::dma_wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaTicket {
    pub ticket: u64,
    pub engine: DmaEngine,
}

/// How a ticket wait ended, short of an error of the copy itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DmaWaitResult {
    /// The copy completed (the ticket is collected).
    Done,
    /// Still running after the timeout (ETIMEDOUT): wait again.
    TimedOut,
    /// A signal arrived (EINTR): wait again.
    Interrupted,
}

impl Device {
    /// `PCIEIPC_IOC_DMA_ALLOC`: a zeroed coherent buffer of `size` bytes for
    /// device `device`.
    pub fn dma_alloc(&self, device: u32, size: u64) -> Result<DmaBuffer, DeviceError> {
        let mut arg = uapi::pcieipc_dma_alloc {
            argsz: size_of::<uapi::pcieipc_dma_alloc>() as u32,
            device,
            size,
            ..Default::default()
        };
        // SAFETY: `arg` is a live, properly sized `pcieipc_dma_alloc`.
        unsafe { uapi::ioctl::dma_alloc(self.file.as_raw_fd(), &mut arg) }
            .map_err(|errno| self.device_error("PCIEIPC_IOC_DMA_ALLOC", device, errno))?;
        Ok(DmaBuffer {
            device,
            handle: arg.buffer,
            size: arg.size,
            bus_addr: arg.bus_addr,
            mmap_offset: arg.mmap_offset,
        })
    }

    /// Maps all of `buffer` into this process.
    pub fn map_dma(&self, buffer: &DmaBuffer) -> Result<MappedWindow, DeviceError> {
        self.map(buffer.mmap_offset, buffer.size as usize)
            .map_err(|errno| DeviceError::DeviceIoctl {
                path: self.path.clone(),
                ioctl: "mmap of a DMA buffer",
                device: buffer.device,
                errno,
            })
    }

    /// `PCIEIPC_IOC_DMA_COPY`: submits a copy of `length` bytes between two
    /// buffers of the same device, executed by that device's engine.
    pub fn dma_copy(
        &self,
        src: (&DmaBuffer, u64),
        dst: (&DmaBuffer, u64),
        length: u64,
    ) -> Result<DmaTicket, DeviceError> {
        self.submit_copy(uapi::pcieipc_dma_copy {
            device: src.0.device,
            src_buffer: src.0.handle,
            dst_buffer: dst.0.handle,
            src_offset: src.1,
            dst_offset: dst.1,
            length,
            ..Default::default()
        })
    }

    /// Copies `length` bytes of `buffer` from `offset` into BAR `bar` of the
    /// buffer's device at `bar_offset` (a CPU copy).
    pub fn dma_copy_to_bar(
        &self,
        buffer: &DmaBuffer,
        offset: u64,
        bar: u32,
        bar_offset: u64,
        length: u64,
    ) -> Result<DmaTicket, DeviceError> {
        self.submit_copy(uapi::pcieipc_dma_copy {
            flags: uapi::PCIEIPC_DMA_DST_BAR,
            device: buffer.device,
            src_buffer: buffer.handle,
            dst_buffer: bar,
            src_offset: offset,
            dst_offset: bar_offset,
            length,
            ..Default::default()
        })
    }

    /// Copies `length` bytes of BAR `bar` of the buffer's device from
    /// `bar_offset` into `buffer` at `offset` (a CPU copy).
    pub fn dma_copy_from_bar(
        &self,
        bar: u32,
        bar_offset: u64,
        buffer: &DmaBuffer,
        offset: u64,
        length: u64,
    ) -> Result<DmaTicket, DeviceError> {
        self.submit_copy(uapi::pcieipc_dma_copy {
            flags: uapi::PCIEIPC_DMA_SRC_BAR,
            device: buffer.device,
            src_buffer: bar,
            dst_buffer: buffer.handle,
            src_offset: bar_offset,
            dst_offset: offset,
            length,
            ..Default::default()
        })
    }

    fn submit_copy(&self, request: uapi::pcieipc_dma_copy) -> Result<DmaTicket, DeviceError> {
        let mut arg = uapi::pcieipc_dma_copy {
            argsz: size_of::<uapi::pcieipc_dma_copy>() as u32,
            ..request
        };
        // SAFETY: `arg` is a live, properly sized `pcieipc_dma_copy`.
        unsafe { uapi::ioctl::dma_copy(self.file.as_raw_fd(), &mut arg) }
            .map_err(|errno| self.device_error("PCIEIPC_IOC_DMA_COPY", request.device, errno))?;
        Ok(DmaTicket {
            ticket: arg.ticket,
            engine: match arg.engine {
                uapi::PCIEIPC_ENGINE_EDU => DmaEngine::Edu,
                _ => DmaEngine::Cpu,
            },
        })
    }

    /// `PCIEIPC_IOC_DMA_WAIT`: sleeps until the copy of `ticket` ends. An
    /// error of the copy itself (ENODEV: the device went away) is an `Err`.
    pub fn dma_wait(
        &self,
        ticket: &DmaTicket,
        timeout: Option<Duration>,
    ) -> Result<DmaWaitResult, DeviceError> {
        let timeout_ms = match timeout {
            None => uapi::PCIEIPC_WAIT_FOREVER,
            Some(t) => t
                .as_millis()
                .min(u128::from(uapi::PCIEIPC_WAIT_FOREVER - 1)) as u32,
        };
        let mut arg = uapi::pcieipc_dma_wait {
            argsz: size_of::<uapi::pcieipc_dma_wait>() as u32,
            ticket: ticket.ticket,
            timeout_ms,
            ..Default::default()
        };
        // SAFETY: `arg` is a live, properly sized `pcieipc_dma_wait`.
        match unsafe { uapi::ioctl::dma_wait(self.file.as_raw_fd(), &mut arg) } {
            Ok(_) => Ok(DmaWaitResult::Done),
            Err(Errno::ETIMEDOUT) => Ok(DmaWaitResult::TimedOut),
            Err(Errno::EINTR) => Ok(DmaWaitResult::Interrupted),
            Err(errno) => Err(self.ioctl_error("PCIEIPC_IOC_DMA_WAIT", errno)),
        }
    }
}
