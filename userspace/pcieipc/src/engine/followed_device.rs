//! The PCI function a rank's data crosses when no transport follows it (a
//! GPU or NIC bound to its vendor driver, under the shm transport and the
//! CUDA backend's control plane): its errors and its link come from the
//! kernel's tracepoints (`ras:aer_event`, `pci:pcie_link_event`) in a
//! tracing instance of the rank's own, so the communicator applies the same
//! AER → action matrix as on the pcieipc transport. The kernel tells no one
//! outside the device's driver when its recovery of such a device ends, so
//! the end is read from sysfs: the function answers config reads again and
//! its link is up. Its removal (hot-unplug, a GPU falling off the bus) shows
//! in no tracepoint the rank follows: each poll reads the function's `vendor`
//! attribute, kept open, which sysfs refuses once the function is gone.
//!
//! Opt-in, as for the pcieipc transport: `PCIEIPC_LINK_TRACEFS` (a tracefs
//! root, or 1), and `CommOptions::link_device` naming the function.

use std::path::{Path, PathBuf};

use nix::sys::statfs::SYSFS_MAGIC;
use std::time::{Duration, Instant};

use crate::event_source::{monotonic_now_ns, tracefs::TraceSession, SourceError};
use crate::events::Severity;
use crate::probe::bdf::Bdf;

use super::chunk::{LinkFacts, RecentErrors};
use super::fault_policy::{retrain_if_degraded, Fault, Loss, Recovery};
use super::link_monitor::{speed_gt_s, tracefs_fact, LinkMonitor, LinkPoll, TracefsFact};
use crate::device::{Device, DEFAULT_PATH};

/// How often a rank waiting for the end of a recovery reads sysfs.
const RECOVERY_POLL: Duration = Duration::from_millis(1);

/// The function whose errors and link a rank follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkDevice {
    pub bdf: Bdf,
    /// The root sysfs is under (`/` on a live machine, sysfs at `/sys`; a
    /// fixture's directory in tests), as the probe's `--sysfs-root`.
    pub root: PathBuf,
}

impl LinkDevice {
    /// The function's directory in sysfs.
    fn dir(&self) -> PathBuf {
        self.root
            .join("sys/bus/pci/devices")
            .join(self.bdf.to_string())
    }
}

/// Why a rank could not follow its device.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("{bdf}: not under {path}: {source}")]
    NoSuchDevice {
        bdf: Bdf,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("following {bdf} through the kernel's tracepoints (PCIEIPC_LINK_TRACEFS): {source}")]
    Tracefs {
        bdf: Bdf,
        #[source]
        source: SourceError,
    },
}

/// The functions from the root port down to `bdf` (itself last), from its
/// place in sysfs's device tree.
fn path_to_root(device: &LinkDevice) -> Result<Vec<String>, FollowError> {
    let link = device.dir();
    let real = std::fs::canonicalize(&link).map_err(|source| FollowError::NoSuchDevice {
        bdf: device.bdf,
        path: link.clone(),
        source,
    })?;
    Ok(real
        .components()
        .filter_map(|part| part.as_os_str().to_str())
        .filter(|part| part.parse::<Bdf>().is_ok())
        .map(str::to_owned)
        .collect())
}

/// Whether `bdf` answers config reads (its vendor ID is not all ones) and
/// its link is up, as sysfs reads now; `None` when the function is gone.
fn answers(dir: &Path) -> Option<bool> {
    let config = std::fs::read(dir.join("config")).ok()?;
    let vendor_ok = config.len() >= 2 && config[..2] != [0xff, 0xff];
    // Functions on a root bus have no link attributes; an endpoint below a
    // port reads "Unknown" while its link is down.
    let link_up = std::fs::read_to_string(dir.join("current_link_speed"))
        .map(|speed| !speed.trim().starts_with("Unknown"))
        .unwrap_or(true);
    Some(vendor_ok && link_up)
}

/// Whether a function is still there, read from its `vendor` attribute,
/// opened once: sysfs answers a read of a removed function's open attribute
/// with ENODEV (no config cycle reaches the device: the kernel keeps the
/// vendor ID). Elsewhere (a copied tree in tests) a removed file is noticed
/// by having no links left.
struct Presence {
    file: std::fs::File,
    on_sysfs: bool,
}

impl Presence {
    fn open(dir: &Path) -> std::io::Result<Presence> {
        let file = std::fs::File::open(dir.join("vendor"))?;
        let on_sysfs =
            nix::sys::statfs::fstatfs(&file).is_ok_and(|fs| fs.filesystem_type() == SYSFS_MAGIC);
        Ok(Presence { file, on_sysfs })
    }

    fn gone(&self) -> bool {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let mut byte = [0u8; 1];
        self.file.read_at(&mut byte, 0).is_err()
            || (!self.on_sysfs && self.file.metadata().map_or(true, |m| m.nlink() == 0))
    }
}

/// One rank's followed device: its link and its recent errors.
pub(crate) struct FollowedDevice {
    bdf: Bdf,
    dir: PathBuf,
    path: Vec<String>,
    /// `None` once its removal was reported.
    presence: Option<Presence>,
    session: TraceSession,
    errors: RecentErrors,
    /// The link's facts as last published; `None` where the job gave none
    /// (host memory's chunks): then only the faults are followed.
    published: Option<LinkFacts>,
}

impl FollowedDevice {
    /// Follows `device` from `link` (its facts now, as the probe read them),
    /// through a tracing instance under `tracefs_root`.
    pub(crate) fn open(
        device: &LinkDevice,
        link: Option<LinkFacts>,
        tracefs_root: &Path,
    ) -> Result<FollowedDevice, FollowError> {
        let path = path_to_root(device)?;
        let presence =
            Presence::open(&device.dir()).map_err(|source| FollowError::NoSuchDevice {
                bdf: device.bdf,
                path: device.dir(),
                source,
            })?;
        let name = format!("pcieipc-follow-{}", std::process::id());
        let session =
            TraceSession::open(tracefs_root, &name).map_err(|source| FollowError::Tracefs {
                bdf: device.bdf,
                source,
            })?;
        Ok(FollowedDevice {
            bdf: device.bdf,
            dir: device.dir(),
            path,
            presence: Some(presence),
            session,
            errors: RecentErrors::default(),
            published: link,
        })
    }
}

impl LinkMonitor for FollowedDevice {
    fn facts(&self) -> Option<LinkFacts> {
        self.published
    }

    /// The events since the last poll (never blocking): the link's facts if
    /// they changed, and the faults. Correctable errors count towards the
    /// smaller chunk; every error is a fault for the matrix to act on, and
    /// so is the device's removal.
    fn poll(&mut self) -> LinkPoll {
        // A failed read keeps the last facts: a device in trouble shows in
        // the next read, or in the job's own calls.
        let events = self
            .session
            .read_available(monotonic_now_ns())
            .map(|batch| batch.events)
            .unwrap_or_default();
        let mut faults = Vec::new();
        if self.presence.as_ref().is_some_and(Presence::gone) {
            self.presence = None;
            faults.push(Fault {
                lost: Some(Loss::Removed),
                ..Fault::error(self.bdf.to_string(), Vec::new())
            });
        }
        let mut link = self.published;
        for found in events
            .iter()
            .filter_map(|event| tracefs_fact(event, &self.path))
        {
            match found {
                TracefsFact::Error(fault) => {
                    if fault
                        .errors
                        .iter()
                        .all(|error| error.severity == Severity::Correctable)
                    {
                        self.errors.record();
                    }
                    faults.push(fault);
                }
                TracefsFact::Link { speed_gt_s, width } => {
                    if let Some(link) = link.as_mut() {
                        link.speed_gt_s = speed_gt_s;
                        link.width = width;
                    }
                }
            }
        }
        let recent = self.errors.count();
        if let Some(link) = link.as_mut() {
            link.recent_aer_errors = recent;
        }
        let changed = (link != self.published).then(|| {
            self.published = link;
            link
        });
        LinkPoll {
            facts: changed.flatten(),
            faults,
            lost_elsewhere: Vec::new(),
        }
    }

    /// Retrains the link above the device where it reads degraded, through
    /// the module's link control (root must have allowed the device: the
    /// module parameter `link_control`), and returns its facts after
    /// (`None` also where the job follows no link facts).
    fn retrain_degraded(&mut self) -> Option<LinkFacts> {
        let device = Device::open(DEFAULT_PATH)
            .inspect_err(|error| {
                eprintln!(
                    "pcieipc: retraining the degraded link above {}: {error}",
                    self.bdf
                )
            })
            .ok()?;
        let after = retrain_if_degraded(&device, self.bdf)?;
        // A job that gave no link facts (host memory's chunks) keeps none.
        let mut facts = self.published?;
        if let Some(speed) = speed_gt_s(after.speed) {
            facts.speed_gt_s = speed;
        }
        facts.width = after.width;
        self.published = Some(facts);
        Some(facts)
    }

    /// Waits at most `bound` for the device to answer config reads with its
    /// link up (the kernel's recovery of a device bound to another driver
    /// is that driver's to see; this is what is visible to everyone).
    fn await_recovery(&mut self, bound: Duration) -> Recovery {
        let started = Instant::now();
        loop {
            match answers(&self.dir) {
                None => return Recovery::Gone,
                Some(true) => return Recovery::Answering,
                Some(false) if started.elapsed() >= bound => {
                    return Recovery::Unfinished {
                        waited_ms: started.elapsed().as_millis() as u32,
                    }
                }
                Some(false) => std::thread::sleep(RECOVERY_POLL),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_function_is_noticed_and_a_present_one_is_not() {
        let dir = std::env::temp_dir().join(format!("pcieipc-presence-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vendor"), "0x1af4\n").unwrap();
        let presence = Presence::open(&dir).unwrap();
        assert!(!presence.on_sysfs);
        assert!(!presence.gone(), "present");
        std::fs::remove_file(dir.join("vendor")).unwrap();
        assert!(presence.gone(), "removed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_device_that_is_not_there_is_named() {
        let device = LinkDevice {
            bdf: "0000:42:00.0".parse().unwrap(),
            root: PathBuf::from("/nonexistent-root"),
        };
        let error = path_to_root(&device).unwrap_err();
        assert!(error.to_string().contains("0000:42:00.0"), "{error}");
    }
}
