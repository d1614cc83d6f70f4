//! The fault path of `/dev/pcieipc`: link status and retraining of any PCI
//! function, watches, and the event stream.

use std::{io::Read, os::fd::AsRawFd, time::Duration};

use pcieipc_uapi as uapi;

use super::node::{Device, DeviceError};
use super::retrain::{Retrain, RetrainRefusal, TargetSpeed};
use crate::events::{Event, Link};
use crate::probe::bdf::Bdf;

/// Where the lockdown LSM shows its mode (securityfs).
const LOCKDOWN_PATH: &str = "/sys/kernel/security/lockdown";

/// The kernel's lockdown mode when it forbids raw PCI access ("integrity" or
/// "confidentiality"), so that an EPERM is explained by it rather than by the
/// module's own rules; None when not locked down or unknown.
fn lockdown_mode() -> Option<String> {
    parse_lockdown(&std::fs::read_to_string(LOCKDOWN_PATH).ok()?)
}

/// The selected mode of a securityfs lockdown file ("none [integrity]
/// confidentiality"), unless it is "none".
fn parse_lockdown(text: &str) -> Option<String> {
    let selected = text
        .split_whitespace()
        .find_map(|word| word.strip_prefix('[').and_then(|w| w.strip_suffix(']')))?;
    (selected != "none").then(|| selected.to_string())
}

impl Device {
    /// `PCIEIPC_IOC_LINK_STATUS`: the link above `bdf` (a `PCIEIPC_BDF`).
    pub fn link_status(&self, bdf: u32) -> Result<Link, DeviceError> {
        let mut arg = uapi::pcieipc_link_status {
            argsz: size_of::<uapi::pcieipc_link_status>() as u32,
            bdf,
            ..Default::default()
        };
        // SAFETY: `arg` is a live `pcieipc_link_status` with its argsz set.
        unsafe { uapi::ioctl::link_status(self.file.as_raw_fd(), &mut arg) }
            .map_err(|errno| self.ioctl_error("PCIEIPC_IOC_LINK_STATUS", errno))?;
        Ok(Link::from_abi(&arg))
    }

    /// `PCIEIPC_IOC_LINK_RETRAIN`: retrains the link above `bdf`, optionally
    /// at a target speed for this retrain; `timeout` None is the kernel's 1 s.
    pub fn retrain(
        &self,
        bdf: u32,
        target_speed: Option<TargetSpeed>,
        timeout: Option<Duration>,
    ) -> Result<Retrain, DeviceError> {
        let mut arg = uapi::pcieipc_link_retrain {
            argsz: size_of::<uapi::pcieipc_link_retrain>() as u32,
            bdf,
            target_speed: target_speed.map_or(0, TargetSpeed::to_abi),
            timeout_ms: timeout.map_or(0, |t| t.as_millis().min(u32::MAX as u128) as u32),
            ..Default::default()
        };
        // SAFETY: `arg` is a live `pcieipc_link_retrain` with its argsz set.
        let result = unsafe { uapi::ioctl::link_retrain(self.file.as_raw_fd(), &mut arg) };
        let completed = match result {
            Ok(_) => true,
            // The module fills before/after also when training timed out.
            Err(nix::errno::Errno::ETIMEDOUT) => false,
            Err(nix::errno::Errno::EPERM) if lockdown_mode().is_some() => {
                return Err(DeviceError::LockedDown {
                    path: self.path.clone(),
                    ioctl: "PCIEIPC_IOC_LINK_RETRAIN",
                    mode: lockdown_mode().unwrap_or_default(),
                });
            }
            Err(errno @ (nix::errno::Errno::EACCES | nix::errno::Errno::EBUSY))
                if arg.refused != uapi::PCIEIPC_LINK_REFUSED_NONE =>
            {
                return Err(DeviceError::RetrainRefused {
                    path: self.path.clone(),
                    bdf: Bdf::from_abi(bdf),
                    refusal: RetrainRefusal::from_abi(arg.refused, Bdf::from_abi(arg.refused_bdf))
                        .ok_or_else(|| self.ioctl_error("PCIEIPC_IOC_LINK_RETRAIN", errno))?,
                });
            }
            Err(errno) => return Err(self.ioctl_error("PCIEIPC_IOC_LINK_RETRAIN", errno)),
        };
        Ok(Retrain {
            before: Link::from_abi(&arg.before),
            after: Link::from_abi(&arg.after),
            elapsed_us: arg.elapsed_us,
            completed,
        })
    }

    /// The AER action matrix's opt-in retrain: retrains the link above
    /// `bdf` where it reads degraded, and returns it after (`None`: not
    /// degraded). Below the speed the port is set to train to counts too:
    /// where the port's Link Capabilities read zero (as QEMU leaves them
    /// after an injected uncorrectable error) the module has no maximum to
    /// compare against, and does not flag the link.
    pub fn retrain_if_degraded(&self, bdf: u32) -> Result<Option<Link>, DeviceError> {
        let status = self.link_status(bdf)?;
        let below_target = status.target_speed != 0 && status.speed < status.target_speed;
        if !status.degraded && !below_target {
            return Ok(None);
        }
        Ok(Some(self.retrain(bdf, None, None)?.after))
    }

    /// `PCIEIPC_IOC_RESET`: function reset of bound device `index`; returns
    /// how long it took.
    pub fn reset(&self, index: u32) -> Result<Duration, DeviceError> {
        let mut arg = uapi::pcieipc_reset {
            argsz: size_of::<uapi::pcieipc_reset>() as u32,
            device: index,
            ..Default::default()
        };
        // SAFETY: `arg` is a live `pcieipc_reset` with its argsz set.
        unsafe { uapi::ioctl::reset(self.file.as_raw_fd(), &mut arg) }
            .map_err(|errno| self.ioctl_error("PCIEIPC_IOC_RESET", errno))?;
        Ok(Duration::from_micros(arg.elapsed_us as u64))
    }

    /// `PCIEIPC_IOC_WATCH` with ADD: check `bdf` every `period`.
    pub fn watch(&self, bdf: u32, period: Duration) -> Result<(), DeviceError> {
        self.watch_call(
            bdf,
            uapi::PCIEIPC_WATCH_ADD,
            period.as_millis().min(u32::MAX as u128) as u32,
        )
    }

    /// `PCIEIPC_IOC_WATCH` with REMOVE.
    pub fn unwatch(&self, bdf: u32) -> Result<(), DeviceError> {
        self.watch_call(bdf, uapi::PCIEIPC_WATCH_REMOVE, 0)
    }

    fn watch_call(&self, bdf: u32, flags: u32, period_ms: u32) -> Result<(), DeviceError> {
        let arg = uapi::pcieipc_watch {
            argsz: size_of::<uapi::pcieipc_watch>() as u32,
            flags,
            bdf,
            period_ms,
        };
        // SAFETY: `arg` is a live `pcieipc_watch` with its argsz set.
        unsafe { uapi::ioctl::watch(self.file.as_raw_fd(), &arg) }
            .map_err(|errno| self.ioctl_error("PCIEIPC_IOC_WATCH", errno))?;
        Ok(())
    }

    /// Reads up to `max` events (at least one; blocks unless the device was
    /// opened non-blocking, then EAGAIN when there is none).
    pub fn read_events(&mut self, max: usize) -> Result<Vec<Event>, DeviceError> {
        let record = size_of::<uapi::pcieipc_event>();
        let mut buffer = vec![0u8; record * max.max(1)];
        let read = self.file.read(&mut buffer).map_err(|e| {
            self.ioctl_error(
                "read",
                e.raw_os_error()
                    .map_or(nix::errno::Errno::EIO, nix::errno::Errno::from_raw),
            )
        })?;
        if read % record != 0 {
            return Err(DeviceError::ShortRecord {
                path: self.path.clone(),
                bytes: read,
                record,
            });
        }
        Ok(buffer[..read]
            .chunks_exact(record)
            .map(|chunk| {
                // SAFETY: `pcieipc_event` is plain integers (any bit pattern
                // is valid) and `chunk` holds exactly one record.
                let raw: uapi::pcieipc_event =
                    unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast()) };
                Event::from_abi(&raw)
            })
            .collect())
    }
}

/// The device's descriptor, for poll/select/epoll on the event stream.
impl std::os::fd::AsFd for Device {
    // `file` is the open /dev/pcieipc.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_lockdown;

    #[test]
    fn lockdown_mode_is_the_selected_word_unless_none() {
        assert_eq!(parse_lockdown("[none] integrity confidentiality\n"), None);
        assert_eq!(
            parse_lockdown("none [integrity] confidentiality\n").as_deref(),
            Some("integrity")
        );
        assert_eq!(
            parse_lockdown("none integrity [confidentiality]").as_deref(),
            Some("confidentiality")
        );
        assert_eq!(parse_lockdown(""), None);
    }
}
