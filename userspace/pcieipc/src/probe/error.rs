//! Errors of the probe's I/O layer: each carries the path it concerns; the
//! underlying cause is its `source()`.

use std::io;
use std::path::PathBuf;

use super::attributes::ParseError;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The sysfs root has no readable PCI device directory: wrong `--sysfs-root`.
    #[error("{path}: cannot list PCI devices")]
    ListDevices { path: PathBuf, source: io::Error },
    /// An entry of /sys/bus/pci/devices is not a link into /sys/devices/.
    #[error("{path}: not a link to a PCI device under sys/devices: {reason}")]
    DeviceLink { path: PathBuf, reason: String },
    /// An attribute file exists and was read but its text is not understood.
    #[error("{path}: malformed attribute")]
    Malformed { path: PathBuf, source: ParseError },
    /// A device read before no longer answers: removed since (maybe found
    /// again at the same address, as a new directory).
    #[error("{path}: the device no longer answers")]
    Vanished { path: PathBuf, source: io::Error },
}
