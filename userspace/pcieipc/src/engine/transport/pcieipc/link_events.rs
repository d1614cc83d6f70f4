//! The link under a pcieipc rank's device, followed through the module's
//! event stream: AER events for the device raise its recent error count, and
//! a watch on the device's link turns speed and width changes into
//! LINK_CHANGE events. Any device the module reports lost (DEVICE_GONE, a
//! permanent failure) is passed on too: it may be a peer's, whose rank can
//! no longer say so through the memory that went with it. The communicator polls it without blocking between
//! calls and publishes what changed, so the next calls are planned for it;
//! each error is also reported as a fault, for the communicator to act on
//! (`engine::fault_policy`), with the end of the kernel's recovery from it
//! (the driver's `resume`, or a permanent failure) for it to wait on.
//!
//! With `PCIEIPC_LINK_TRACEFS` set (to a tracefs root, or to 1 for
//! /sys/kernel/tracing), each rank also follows the kernel's tracepoints in a
//! tracing instance of its own: correctable errors its upstream port reports
//! (the kernel calls no driver below the port for those, so the module never
//! sees them) and the kernel's own updates of that port's link. Opt-in: it
//! needs root, and a rank that is killed leaves its instance behind.

use std::time::{Duration, Instant};

use crate::device::{BoundDevice, Device, DeviceError, DEFAULT_PATH};
use crate::event_source::{monotonic_now_ns, tracefs::TraceSession};
use crate::events::{Event, EventKind, Severity};
use crate::probe::bdf::Bdf;

use super::PcieipcError;
use crate::engine::chunk::{LinkFacts, RecentErrors};
use crate::engine::fault_policy::{retrain_if_degraded, Fault, Loss, Recovery};
use crate::engine::link_monitor::{
    speed_gt_s, tracefs_fact, tracefs_root, LinkMonitor, LinkPoll, TracefsFact, TRACEFS_ENV,
};

/// How often the module's watch reads the link's status.
const WATCH_PERIOD: Duration = Duration::from_millis(100);
/// Events read per `read()`: the module's ring holds 256.
const EVENTS_PER_READ: usize = 64;
/// How often a rank waiting for the end of a recovery reads the events.
const RECOVERY_POLL: Duration = Duration::from_millis(1);

/// The AER steps that report a new error; the later steps of a recovery
/// (mmio_enabled, slot_reset, resume) belong to the same one.
fn reports_new_error(event: &Event) -> bool {
    event.kind == EventKind::Aer
        && matches!(
            event.aer_step,
            Some("error_detected" | "cor_error_detected")
        )
}

/// What a tracefs event says about the link above a rank's device, on
/// `path` (its upstream port, then the device): a new error of the port (a
/// correctable one: uncorrectable ones reach the module's error handlers,
/// which already count them), or the port's link after a change the kernel
/// made. Events of other devices, the device's own errors (the module's to
/// report) and the module's events say nothing here.
fn port_fact(event: &Event, path: &[String; 2]) -> Option<TracefsFact> {
    match tracefs_fact(event, path)? {
        TracefsFact::Error(fault)
            if fault.bdf == path[0]
                && fault
                    .errors
                    .iter()
                    .all(|e| e.severity == Severity::Correctable) =>
        {
            Some(TracefsFact::Error(fault))
        }
        TracefsFact::Error(_) => None,
        link @ TracefsFact::Link { .. } => Some(link),
    }
}

/// Where a module event for the device leaves the kernel's recovery: `None`
/// for an error that starts one (unfinished until a later step ends it),
/// the outcome for a step that ends it, and the recovery as it was for
/// anything else. A `resume` ends it; a permanent failure, a `disconnect`
/// result or the device gone end it for good, and the first of those stands
/// (a device the kernel gave up then leaves: DEVICE_GONE follows).
fn recovery_after(event: &Event, before: Option<Recovery>) -> Option<Recovery> {
    if let Some(loss) = loss(event) {
        return match before {
            Some(Recovery::Failed | Recovery::Gone) => before,
            _ => Some(loss.recovery()),
        };
    }
    match event.kind {
        EventKind::Aer if event.aer_step == Some("error_detected") => None,
        EventKind::Aer if event.aer_step == Some("resume") => Some(Recovery::Recovered),
        _ => before,
    }
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
    /// The link's speed and width, where the module reads one above the
    /// device (none on a root bus: then only faults are followed).
    link: Option<(f32, u8)>,
    aer_errors: RecentErrors,
    /// The faults read since the last poll.
    faults: Vec<Fault>,
    /// Other devices the module reported lost since the last poll.
    lost_elsewhere: Vec<Fault>,
    /// How the kernel's last recovery of the device ended; `None` while one
    /// runs.
    recovery: Option<Recovery>,
    /// What `poll` last returned.
    published: Option<LinkFacts>,
    /// The port above the device and the device, and the kernel's
    /// tracepoints, where the job opted in (`PCIEIPC_LINK_TRACEFS`).
    trace: Option<([String; 2], TraceSession)>,
}

impl LinkEvents {
    /// Follows the device `mine` and the link above it, from its status now
    /// (the device list holds the status at bind time); a device on a root
    /// bus has no link, and only its faults are followed.
    pub(super) fn open(mine: &BoundDevice) -> Result<LinkEvents, PcieipcError> {
        let mut device = Device::open_with(DEFAULT_PATH, true)?;
        // A new file's cursor starts at the oldest event the module keeps:
        // skip what happened before this job.
        while !read_available(&mut device)?.is_empty() {}
        // The module names devices in PCI address form, in domains its ABI
        // encodes (it refuses the others).
        let abi_bdf = mine
            .bdf
            .parse::<Bdf>()
            .ok()
            .and_then(|bdf| bdf.to_abi().ok());
        let link = match abi_bdf {
            Some(abi_bdf) => {
                let status = device.link_status(abi_bdf)?;
                speed_gt_s(status.speed).map(|speed| (speed, status.width))
            }
            None => None,
        };
        let watching = match (abi_bdf, link) {
            (Some(abi_bdf), Some(_)) => match device.watch(abi_bdf, WATCH_PERIOD) {
                Ok(()) => true,
                Err(error) if error.errno() == Some(nix::errno::Errno::EEXIST) => false,
                Err(error) => return Err(error.into()),
            },
            _ => false,
        };
        let published = link.map(|(speed_gt_s, width)| LinkFacts {
            speed_gt_s,
            width,
            recent_aer_errors: 0,
            // The module watches PCIe functions; NVLink is the probe's to see.
            over_nvlink: false,
        });
        let trace = match (tracefs_root(), &mine.upstream_bdf, link) {
            (Some(root), Some(port), Some(_)) => {
                let name = format!("pcieipc-rank-{}", std::process::id());
                // The job asked for it: a failure is reported, not ignored.
                let session =
                    TraceSession::open(&root, &name).map_err(|source| PcieipcError::Tracefs {
                        env: TRACEFS_ENV,
                        source,
                    })?;
                Some(([port.clone(), mine.bdf.clone()], session))
            }
            _ => None,
        };
        Ok(LinkEvents {
            device,
            bdf: mine.bdf.clone(),
            watching,
            link,
            aer_errors: RecentErrors::default(),
            faults: Vec::new(),
            lost_elsewhere: Vec::new(),
            recovery: Some(Recovery::Recovered),
            published,
            trace,
        })
    }

    /// Applies the module's events that arrived since the last read: all
    /// of this rank's device, and the losses of others.
    fn read_module_events(&mut self) {
        while let Ok(events) = read_available(&mut self.device) {
            if events.is_empty() {
                break;
            }
            for event in &events {
                if event.bdf == self.bdf {
                    self.apply(event);
                } else if let Some(loss) = loss(event) {
                    self.lost_elsewhere.push(Fault {
                        lost: Some(loss),
                        ..Fault::error(event.bdf.clone(), event.errors.clone())
                    });
                }
            }
        }
    }

    fn apply(&mut self, event: &Event) {
        if reports_new_error(event) {
            self.aer_errors.record();
        }
        let lost = loss(event);
        if reports_new_error(event) || lost.is_some() {
            self.faults.push(Fault {
                lost,
                ..Fault::error(event.bdf.clone(), event.errors.clone())
            });
        }
        self.recovery = recovery_after(event, self.recovery);
        if event.kind == EventKind::LinkChange {
            if let Some(after) = &event.link_after {
                if let (Some(speed), Some(link)) = (speed_gt_s(after.speed), self.link.as_mut()) {
                    *link = (speed, after.width);
                }
            }
        }
    }
}

impl LinkMonitor for LinkEvents {
    /// The link as it stands now, where there is one.
    fn facts(&self) -> Option<LinkFacts> {
        self.published
    }

    /// Reads the events that arrived since the last poll (never blocking) and
    /// returns the link's facts if they changed, the faults, and the other
    /// devices the module reported lost. A failed read keeps the last facts:
    /// a device in trouble fails the transport's own calls.
    fn poll(&mut self) -> LinkPoll {
        self.read_module_events();
        if let Some((path, session)) = self.trace.as_mut() {
            // A failed read keeps the last facts, as for the module.
            let events = session
                .read_available(monotonic_now_ns())
                .map(|batch| batch.events)
                .unwrap_or_default();
            for fact in events.iter().filter_map(|e| port_fact(e, path)) {
                match fact {
                    TracefsFact::Error(fault) => {
                        self.aer_errors.record();
                        self.faults.push(fault);
                    }
                    TracefsFact::Link { speed_gt_s, width } => {
                        self.link = Some((speed_gt_s, width));
                    }
                }
            }
        }
        let facts = self.link.map(|(speed_gt_s, width)| LinkFacts {
            speed_gt_s,
            width,
            recent_aer_errors: self.aer_errors.count(),
            over_nvlink: false,
        });
        let changed = (facts != self.published).then(|| {
            self.published = facts;
            facts
        });
        LinkPoll {
            facts: changed.flatten(),
            faults: std::mem::take(&mut self.faults),
            lost_elsewhere: std::mem::take(&mut self.lost_elsewhere),
        }
    }

    /// Retrains the link above the device where it reads degraded, and
    /// returns its facts after (`None`: not degraded). A failed status read
    /// or retrain leaves the facts as they were, and is said: the job asked
    /// for the retrain.
    fn retrain_degraded(&mut self) -> Option<LinkFacts> {
        let bdf = self.bdf.parse::<Bdf>().ok()?;
        let after = retrain_if_degraded(&self.device, bdf)?;
        let speed = speed_gt_s(after.speed);
        let (speed_gt_s, _) = self.link?;
        self.link = Some((speed.unwrap_or(speed_gt_s), after.width));
        let published = self.published.as_mut()?;
        published.speed_gt_s = speed.unwrap_or(speed_gt_s);
        published.width = after.width;
        Some(*published)
    }

    /// Waits at most `bound` for the kernel's recovery of the device to end,
    /// reading the module's events as they come.
    fn await_recovery(&mut self, bound: Duration) -> Recovery {
        let started = Instant::now();
        loop {
            if let Some(recovery) = self.recovery {
                return recovery;
            }
            if started.elapsed() >= bound {
                return Recovery::Unfinished {
                    waited_ms: started.elapsed().as_millis() as u32,
                };
            }
            std::thread::sleep(RECOVERY_POLL);
            self.read_module_events();
        }
    }
}

/// The loss a module event reports, if it reports one: DEVICE_GONE (removed
/// or unbound; a watch's config reads of all ones), or the kernel giving the
/// device up after an error.
fn loss(event: &Event) -> Option<Loss> {
    if event.kind == EventKind::DeviceGone {
        Some(Loss::Removed)
    } else if event.kind == EventKind::Aer
        && (event.channel_state == Some("permanent_failure")
            || event.result.as_deref() == Some("disconnect"))
    {
        Some(Loss::GivenUp)
    } else {
        None
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_source::trace_text::{parse_line, to_event};
    use crate::events::EventSource;

    fn traced(line: &str) -> Event {
        to_event(&parse_line(line).unwrap().unwrap(), 0, 0)
    }

    const PORT: &str = "0000:00:11.0";
    const PATH: [&str; 2] = [PORT, "0000:01:00.0"];

    fn path() -> [String; 2] {
        PATH.map(str::to_owned)
    }
    // Lines of the testbed kernel's trace_pipe (see trace_text's tests).
    const CORRECTABLE: &str = "   irq/25-aerdrv-34      [001] .....     4.954258: aer_event: 0000:00:11.0 PCIe Bus Error: severity=Corrected, Bad TLP, TLP Header=Not available";
    const NONFATAL: &str = "   irq/25-aerdrv-34      [001] .....     4.917689: aer_event: 0000:00:11.0 PCIe Bus Error: severity=Uncorrected, non-fatal, Completion Timeout, TLP Header=Not available";
    const LINK: &str = "              sh-58      [000] .....     5.103412: pcie_link_event: 0000:00:11.0 type:4, reason:1, cur_bus_speed:22, max_bus_speed:22, width:4, flit_mode:0, status:DLLLA";

    #[test]
    fn correctable_errors_of_the_port_count() {
        let event = traced(CORRECTABLE);
        assert_eq!(
            port_fact(&event, &path()),
            Some(TracefsFact::Error(Fault::error(
                PORT.to_owned(),
                event.errors.clone()
            )))
        );
        // Another port's error is not this rank's.
        let elsewhere = ["0000:00:10.0".to_owned(), PATH[1].to_owned()];
        assert_eq!(port_fact(&event, &elsewhere), None);
    }

    #[test]
    fn uncorrectable_errors_are_left_to_the_module() {
        // The AER core calls error_detected on the device below the port:
        // the module's event counts it once.
        assert_eq!(port_fact(&traced(NONFATAL), &path()), None);
    }

    #[test]
    fn the_kernel_link_updates_of_the_port_set_speed_and_width() {
        assert_eq!(
            port_fact(&traced(LINK), &path()),
            Some(TracefsFact::Link {
                speed_gt_s: 8.0,
                width: 4
            })
        );
        let mut unknown = traced(LINK);
        unknown.link_after.as_mut().unwrap().speed = 0;
        assert_eq!(port_fact(&unknown, &path()), None);
    }

    fn module_step(step: &'static str, state: &'static str, result: &str) -> Event {
        let mut event = Event::new(
            EventSource::Module,
            EventKind::Aer,
            "0000:02:00.0".into(),
            0,
        );
        event.aer_step = Some(step);
        event.channel_state = Some(state);
        event.result = Some(result.into());
        event
    }

    #[test]
    fn a_recovery_runs_from_error_detected_to_resume_or_a_failure() {
        let recovered = Some(Recovery::Recovered);
        // The non-fatal sequence, then the fatal one (testbed, aer.sh).
        let mut recovery = recovered;
        for (step, state, result, after) in [
            ("error_detected", "normal", "can_recover", None),
            ("mmio_enabled", "normal", "recovered", None),
            ("resume", "normal", "recovered", recovered),
            ("error_detected", "frozen", "need_reset", None),
            ("slot_reset", "normal", "recovered", None),
            ("resume", "normal", "recovered", recovered),
        ] {
            recovery = recovery_after(&module_step(step, state, result), recovery);
            assert_eq!(recovery, after, "{step} {state}");
        }
        let lost = module_step("error_detected", "permanent_failure", "disconnect");
        assert_eq!(recovery_after(&lost, None), Some(Recovery::Failed));
        let gone = Event::new(
            EventSource::Module,
            EventKind::DeviceGone,
            "0000:02:00.0".into(),
            0,
        );
        assert_eq!(recovery_after(&gone, None), Some(Recovery::Gone));
        assert_eq!(
            recovery_after(&gone, recovery_after(&lost, None)),
            Some(Recovery::Failed),
            "given up, then gone: the kernel gave it up"
        );
        // A link change says nothing about a recovery.
        let link = Event::new(
            EventSource::Module,
            EventKind::LinkChange,
            "0000:02:00.0".into(),
            0,
        );
        assert_eq!(recovery_after(&link, None), None);
        assert_eq!(recovery_after(&link, recovered), recovered);
    }

    #[test]
    fn module_events_are_not_tracefs_facts() {
        let mut event = traced(CORRECTABLE);
        event.source = EventSource::Module;
        assert_eq!(port_fact(&event, &path()), None);
    }
}
