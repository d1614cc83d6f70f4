//! The link under a pcieipc rank's device, followed through the module's
//! event stream: AER events for the device raise its recent error count, and
//! a watch on the device's link turns speed and width changes into
//! LINK_CHANGE events. The communicator polls it without blocking between
//! calls and publishes what changed, so the next calls are planned for it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::device::{BoundDevice, Device, DeviceError, DEFAULT_PATH};
use crate::events::{Event, EventKind};
use crate::probe::bdf::Bdf;
use crate::probe::link::LinkSpeed;

use crate::engine::chunk::LinkFacts;

/// How long an AER error counts as recent: long enough that a link that
/// keeps erring stays on the smaller chunk, short enough that a link that
/// recovered gets its healthy chunk back.
pub const AER_MEMORY: Duration = Duration::from_secs(60);
/// How often the module's watch reads the link's status.
const WATCH_PERIOD: Duration = Duration::from_millis(100);
/// Events read per `read()`: the module's ring holds 256.
const EVENTS_PER_READ: usize = 64;

/// The AER steps that report a new error; the later steps of a recovery
/// (mmio_enabled, slot_reset, resume) belong to the same one.
fn reports_new_error(event: &Event) -> bool {
    event.kind == EventKind::Aer
        && matches!(
            event.aer_step,
            Some("error_detected" | "cor_error_detected")
        )
}

/// One rank's device link and its recent AER errors.
pub(crate) struct LinkEvents {
    /// A non-blocking `/dev/pcieipc` of its own: every open file has its own
    /// cursor in the event stream.
    device: Device,
    bdf: String,
    /// Whether this rank added the watch (and so removes it on drop); another
    /// process's watch on the same link serves as well.
    watching: bool,
    speed_gt_s: f32,
    width: u8,
    aer_errors: VecDeque<Instant>,
    /// What `poll` last returned.
    published: LinkFacts,
}

impl LinkEvents {
    /// Follows the link above `mine` from its status now (the device list
    /// holds the status at bind time); `None` when the module reads no link
    /// speed above it (a device on a root bus), which leaves nothing to follow.
    pub(super) fn open(mine: &BoundDevice) -> Result<Option<LinkEvents>, DeviceError> {
        let mut device = Device::open_with(DEFAULT_PATH, true)?;
        // A new file's cursor starts at the oldest event the module keeps:
        // skip what happened before this job.
        while !read_available(&mut device)?.is_empty() {}
        // The module names devices in PCI address form, in domains its ABI
        // encodes (it refuses the others): anything else has no link to follow.
        let Some(abi_bdf) = mine
            .bdf
            .parse::<Bdf>()
            .ok()
            .and_then(|bdf| bdf.to_abi().ok())
        else {
            return Ok(None);
        };
        let link = device.link_status(abi_bdf)?;
        let Some(speed) = LinkSpeed::from_encoding(link.speed) else {
            return Ok(None);
        };
        let watching = match device.watch(abi_bdf, WATCH_PERIOD) {
            Ok(()) => true,
            Err(error) if error.errno() == Some(nix::errno::Errno::EEXIST) => false,
            Err(error) => return Err(error),
        };
        let facts = LinkFacts {
            speed_gt_s: speed.gigatransfers_per_second() as f32,
            width: link.width,
            recent_aer_errors: 0,
            // The module watches PCIe functions; NVLink is the probe's to see.
            over_nvlink: false,
        };
        Ok(Some(LinkEvents {
            device,
            bdf: mine.bdf.clone(),
            watching,
            speed_gt_s: facts.speed_gt_s,
            width: facts.width,
            aer_errors: VecDeque::new(),
            published: facts,
        }))
    }

    /// The link as it stands now.
    pub(super) fn facts(&self) -> LinkFacts {
        self.published
    }

    /// Reads the events that arrived since the last poll (never blocking) and
    /// returns the link's facts if they changed. A failed read keeps the last
    /// facts: a device in trouble fails the transport's own calls.
    pub(super) fn poll(&mut self) -> Option<LinkFacts> {
        while let Ok(events) = read_available(&mut self.device) {
            if events.is_empty() {
                break;
            }
            for event in &events {
                if event.bdf == self.bdf {
                    self.apply(event);
                }
            }
        }
        let now = Instant::now();
        while self
            .aer_errors
            .front()
            .is_some_and(|at| now.duration_since(*at) > AER_MEMORY)
        {
            self.aer_errors.pop_front();
        }
        let facts = LinkFacts {
            speed_gt_s: self.speed_gt_s,
            width: self.width,
            recent_aer_errors: self.aer_errors.len() as u64,
            over_nvlink: false,
        };
        (facts != self.published).then(|| {
            self.published = facts;
            facts
        })
    }

    fn apply(&mut self, event: &Event) {
        if reports_new_error(event) {
            self.aer_errors.push_back(Instant::now());
        }
        if event.kind == EventKind::LinkChange {
            if let Some(after) = &event.link_after {
                if let Some(speed) = LinkSpeed::from_encoding(after.speed) {
                    self.speed_gt_s = speed.gigatransfers_per_second() as f32;
                }
                self.width = after.width;
            }
        }
    }
}

/// The events waiting on `device` (opened non-blocking); empty when none.
fn read_available(device: &mut Device) -> Result<Vec<Event>, DeviceError> {
    match device.read_events(EVENTS_PER_READ) {
        Err(error) if error.errno() == Some(nix::errno::Errno::EAGAIN) => Ok(Vec::new()),
        other => other,
    }
}

impl Drop for LinkEvents {
    fn drop(&mut self) {
        if self.watching {
            if let Some(bdf) = self
                .bdf
                .parse::<Bdf>()
                .ok()
                .and_then(|bdf| bdf.to_abi().ok())
            {
                // The module drops every watch when it is unloaded; a failure
                // here leaves one periodic status read behind until then.
                let _ = self.device.unwatch(bdf);
            }
        }
    }
}
