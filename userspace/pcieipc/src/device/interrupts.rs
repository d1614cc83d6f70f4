//! Interrupt counters, blocking waits and doorbells.

use std::{os::fd::AsRawFd, time::Duration};

use nix::errno::Errno;
use pcieipc_uapi as uapi;

use super::node::{Device, DeviceError};

/// How a wait ended, short of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitResult {
    /// The count passed `last_seen`: the count now.
    Interrupt(u64),
    /// The timeout passed first (ETIMEDOUT).
    TimedOut,
    /// A signal arrived first (EINTR): call again with the same arguments.
    Interrupted,
}

impl Device {
    /// `PCIEIPC_IOC_WAIT`: blocks until vector `vector` of device `device`
    /// has counted more than `last_seen` interrupts. `timeout` `None` waits
    /// without a limit; a zero timeout does not block. A gone device fails
    /// with ENODEV, a frozen one with EIO.
    pub fn wait(
        &self,
        device: u32,
        vector: u32,
        last_seen: u64,
        timeout: Option<Duration>,
    ) -> Result<WaitResult, DeviceError> {
        let timeout_ms = match timeout {
            None => uapi::PCIEIPC_WAIT_FOREVER,
            // Capped one below the "forever" value.
            Some(t) => t
                .as_millis()
                .min(u128::from(uapi::PCIEIPC_WAIT_FOREVER - 1)) as u32,
        };
        let mut arg = uapi::pcieipc_wait {
            argsz: size_of::<uapi::pcieipc_wait>() as u32,
            device,
            vector,
            last_seen,
            timeout_ms,
            ..Default::default()
        };
        // SAFETY: `arg` is a live, properly sized `pcieipc_wait`.
        match unsafe { uapi::ioctl::wait(self.file.as_raw_fd(), &mut arg) } {
            Ok(_) => Ok(WaitResult::Interrupt(arg.count)),
            Err(Errno::ETIMEDOUT) => Ok(WaitResult::TimedOut),
            Err(Errno::EINTR) => Ok(WaitResult::Interrupted),
            Err(errno) => Err(self.device_error("PCIEIPC_IOC_WAIT", device, errno)),
        }
    }

    /// `PCIEIPC_IOC_COUNTERS`: the interrupt count of every vector.
    pub fn counters(&self, device: u32) -> Result<Vec<u64>, DeviceError> {
        let mut arg = uapi::pcieipc_counters {
            argsz: size_of::<uapi::pcieipc_counters>() as u32,
            device,
            ..Default::default()
        };
        // SAFETY: `arg` is a live, properly sized `pcieipc_counters`.
        unsafe { uapi::ioctl::counters(self.file.as_raw_fd(), &mut arg) }
            .map_err(|errno| self.device_error("PCIEIPC_IOC_COUNTERS", device, errno))?;
        let n = (arg.num_vectors as usize).min(arg.counts.len());
        Ok(arg.counts[..n].to_vec())
    }

    /// `PCIEIPC_IOC_RING`: raises vector `vector` of the ivshmem peer
    /// `peer` through device `device`'s doorbell.
    pub fn ring(&self, device: u32, peer: u16, vector: u16) -> Result<(), DeviceError> {
        let mut arg = uapi::pcieipc_ring {
            argsz: size_of::<uapi::pcieipc_ring>() as u32,
            device,
            peer,
            vector,
            ..Default::default()
        };
        // SAFETY: `arg` is a live, properly sized `pcieipc_ring`.
        unsafe { uapi::ioctl::ring(self.file.as_raw_fd(), &mut arg) }
            .map_err(|errno| self.device_error("PCIEIPC_IOC_RING", device, errno))?;
        Ok(())
    }
}
