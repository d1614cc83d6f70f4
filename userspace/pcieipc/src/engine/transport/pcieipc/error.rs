//! Why the pcieipc transport could not be set up on a rank.

use crate::device::DeviceError;

/// Why the pcieipc transport could not be set up on a rank.
#[derive(Debug, thiserror::Error)]
pub enum PcieipcError {
    #[error(transparent)]
    Device(#[from] DeviceError),

    /// The kernel's tracepoints a job asked for (`PCIEIPC_LINK_TRACEFS`).
    #[error("{env}: {source}")]
    Tracefs {
        env: &'static str,
        source: crate::event_source::SourceError,
    },

    #[error(
        "needs bound ivshmem-doorbell device number {position} (counting from 0) of {path}, \
         but only {found} are bound"
    )]
    TooFewDevices {
        path: String,
        position: usize,
        found: usize,
    },

    #[error(
        "device {device} of {path} is not a bound ivshmem-doorbell device with a peer id \
         and a doorbell vector"
    )]
    NotIvshmem { path: String, device: u32 },

    #[error(
        "device {device}: BAR2 holds {bar_bytes} bytes, the windows of {nranks} ranks need \
         {needed} (use a larger region, or smaller chunks or fewer chunks in flight)"
    )]
    RegionTooSmall {
        device: u32,
        bar_bytes: u64,
        needed: usize,
        nranks: usize,
    },

    #[error("window sizes out of range: {0}")]
    WindowSizes(String),

    #[error(
        "device {device}: its BAR2 is not the region rank 0 set up for this job (the ranks' \
         devices belong to different ivshmem regions, or another job took the region)"
    )]
    ForeignRegion { device: u32 },
}
