//! The open `/dev/pcieipc`: opening it, its errors, and its ABI version.

use std::{
    ffi::CStr,
    fs::{File, OpenOptions},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use pcieipc_uapi as uapi;

use super::link_control::allow_line;
use super::retrain::RetrainRefusal;
use crate::probe::bdf::Bdf;

/// How root allows what was refused, where that is possible.
fn allow_hint(bdf: &Bdf, refusal: &RetrainRefusal) -> String {
    match refusal {
        RetrainRefusal::NotAllowed => format!("; to allow it: {}", allow_line(*bdf)),
        _ => String::new(),
    }
}

/// Where the module's misc device appears.
pub const DEFAULT_PATH: &str = "/dev/pcieipc";

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("{path}: cannot open: {source} (is pcieipc.ko loaded? `insmod pcieipc.ko`)")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {ioctl} failed: {errno}")]
    Ioctl {
        path: PathBuf,
        ioctl: &'static str,
        errno: nix::errno::Errno,
    },
    #[error(
        "{path}: retrain of the link above {bdf} refused: {refusal}{}",
        allow_hint(bdf, refusal)
    )]
    RetrainRefused {
        path: PathBuf,
        bdf: Bdf,
        refusal: RetrainRefusal,
    },
    #[error(
        "{path}: {ioctl} refused (EPERM): the kernel is locked down ({mode}, \
         /sys/kernel/security/lockdown), which forbids raw PCI access"
    )]
    LockedDown {
        path: PathBuf,
        ioctl: &'static str,
        mode: String,
    },
    #[error("{path}: {ioctl} on device {device}: {errno}")]
    DeviceIoctl {
        path: PathBuf,
        ioctl: &'static str,
        device: u32,
        errno: nix::errno::Errno,
    },
    #[error("{path}: mmap of device {device} BAR {bar} ({len} bytes at {offset:#x}): {errno}")]
    Mmap {
        path: PathBuf,
        device: u32,
        bar: u32,
        offset: u64,
        len: usize,
        errno: nix::errno::Errno,
    },
    #[error("{path}: read {bytes} bytes, not a whole number of {record}-byte event records")]
    ShortRecord {
        path: PathBuf,
        bytes: usize,
        record: usize,
    },
    #[error(
        "{path}: the module speaks ABI {module_major}.{module_minor}, this program ABI {ours_major}.{ours_minor}: \
         load the module built from the same sources"
    )]
    AbiMismatch {
        path: PathBuf,
        module_major: u16,
        module_minor: u16,
        ours_major: u16,
        ours_minor: u16,
    },
}

/// The ABI this program speaks (`include/uapi/pcieipc.h`): a module must
/// speak the same major version and at least this minor one.
pub const ABI_VERSION: (u16, u16) = (
    uapi::PCIEIPC_ABI_MAJOR as u16,
    uapi::PCIEIPC_ABI_MINOR as u16,
);

/// What `PCIEIPC_IOC_VERSION` reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ModuleVersion {
    pub abi_major: u16,
    pub abi_minor: u16,
    pub bound_devices: u32,
    pub module_version: String,
    /// Events emitted since the module was loaded (ABI 0.4).
    pub events_emitted: u64,
}

/// An open `/dev/pcieipc`.
#[derive(Debug)]
pub struct Device {
    pub(super) file: File,
    pub(super) path: PathBuf,
}

impl Device {
    /// Opens the device and checks that the module speaks this program's ABI
    /// major version (a newer minor version is compatible).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DeviceError> {
        Self::open_with(path, false)
    }

    /// As `open`; `nonblocking` makes `read_events` return EAGAIN instead of
    /// waiting.
    pub fn open_with(path: impl AsRef<Path>, nonblocking: bool) -> Result<Self, DeviceError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(if nonblocking {
                nix::libc::O_NONBLOCK
            } else {
                0
            })
            .open(&path)
            .map_err(|source| DeviceError::Open {
                path: path.clone(),
                source,
            })?;
        let device = Self { file, path };
        let version = device.version()?;
        let (ours_major, ours_minor) = ABI_VERSION;
        if version.abi_major != ours_major || version.abi_minor < ours_minor {
            return Err(DeviceError::AbiMismatch {
                path: device.path,
                module_major: version.abi_major,
                module_minor: version.abi_minor,
                ours_major,
                ours_minor,
            });
        }
        Ok(device)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `PCIEIPC_IOC_VERSION`.
    pub fn version(&self) -> Result<ModuleVersion, DeviceError> {
        let mut arg = uapi::pcieipc_version {
            argsz: size_of::<uapi::pcieipc_version>() as u32,
            ..Default::default()
        };
        // SAFETY: `arg` is a live, properly sized `pcieipc_version` whose argsz
        // tells the module how far it may write.
        unsafe { uapi::ioctl::version(self.file.as_raw_fd(), &mut arg) }
            .map_err(|errno| self.ioctl_error("PCIEIPC_IOC_VERSION", errno))?;
        let bytes: Vec<u8> = arg.module_version.iter().map(|&c| c as u8).collect();
        let module_version = CStr::from_bytes_until_nul(&bytes)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
        Ok(ModuleVersion {
            abi_major: arg.abi_major,
            abi_minor: arg.abi_minor,
            bound_devices: arg.bound_devices,
            module_version,
            events_emitted: arg.events_emitted,
        })
    }

    pub(super) fn ioctl_error(&self, ioctl: &'static str, errno: nix::errno::Errno) -> DeviceError {
        DeviceError::Ioctl {
            path: self.path.clone(),
            ioctl,
            errno,
        }
    }

    pub(super) fn device_error(
        &self,
        ioctl: &'static str,
        device: u32,
        errno: nix::errno::Errno,
    ) -> DeviceError {
        DeviceError::DeviceIoctl {
            path: self.path.clone(),
            ioctl,
            device,
            errno,
        }
    }
}

impl DeviceError {
    /// The errno the module answered with, if the error is one.
    pub fn errno(&self) -> Option<nix::errno::Errno> {
        match self {
            DeviceError::Ioctl { errno, .. }
            | DeviceError::DeviceIoctl { errno, .. }
            | DeviceError::Mmap { errno, .. } => Some(*errno),
            DeviceError::LockedDown { .. } => Some(nix::errno::Errno::EPERM),
            DeviceError::RetrainRefused { refusal, .. } => Some(match refusal {
                RetrainRefusal::BandwidthController { .. } => nix::errno::Errno::EBUSY,
                _ => nix::errno::Errno::EACCES,
            }),
            DeviceError::Open { .. }
            | DeviceError::AbiMismatch { .. }
            | DeviceError::ShortRecord { .. } => None,
        }
    }
}
