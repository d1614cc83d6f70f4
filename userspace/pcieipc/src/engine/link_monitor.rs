//! Following the link a rank's data crosses: the one trait the fault
//! monitor polls (`LinkMonitor`), implemented by the pcieipc transport's
//! own device (the module's events, `LinkEvents`) and by a device followed
//! through the kernel's tracepoints (`FollowedDevice`), and the one reading
//! of a tracepoint event that both use.

use std::path::PathBuf;
use std::time::Duration;

use super::chunk::LinkFacts;
use super::fault_policy::{Fault, Recovery};
use crate::event_source::DEFAULT_TRACEFS_ROOT;
use crate::events::{Event, EventKind, EventSource};
use crate::probe::link::LinkSpeed;

/// Opts a rank into following the kernel's tracepoints: a tracefs root, or 1.
pub const TRACEFS_ENV: &str = "PCIEIPC_LINK_TRACEFS";

/// The tracefs root `PCIEIPC_LINK_TRACEFS` names, if set (1: the default
/// root).
pub(crate) fn tracefs_root() -> Option<PathBuf> {
    let value = std::env::var_os(TRACEFS_ENV)?;
    if value.is_empty() || value == "0" {
        return None;
    }
    Some(if value == "1" {
        PathBuf::from(DEFAULT_TRACEFS_ROOT)
    } else {
        PathBuf::from(value)
    })
}

/// What one poll of a device link found.
#[derive(Debug, Default)]
pub struct LinkPoll {
    /// The link's facts, if they changed.
    pub facts: Option<LinkFacts>,
    /// The faults reported on it, oldest first.
    pub faults: Vec<Fault>,
    /// Other devices the module reported lost, for the transport to
    /// attribute to the peers whose devices they are (or to drop).
    pub lost_elsewhere: Vec<Fault>,
}

/// A device link followed for its faults and its facts.
pub(crate) trait LinkMonitor: Send {
    /// The link's facts as they stand (`None`: no link is followed, only
    /// the device's faults).
    fn facts(&self) -> Option<LinkFacts>;
    /// The link's facts if they changed since the last poll, and the
    /// faults reported since; never blocks.
    fn poll(&mut self) -> LinkPoll;
    /// Retrains the link if it reads degraded and returns its facts after;
    /// `None` when it is not degraded (or no link facts are followed).
    fn retrain_degraded(&mut self) -> Option<LinkFacts>;
    /// Waits at most `bound` for the kernel's recovery of the device from
    /// the last fault `poll` reported to end.
    fn await_recovery(&mut self, bound: Duration) -> Recovery;
}

/// What a tracepoint event says about a device.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum TracefsFact {
    /// An error the device or a port on its path reported.
    Error(Fault),
    /// The link above the device after a change the kernel made.
    Link { speed_gt_s: f32, width: u8 },
}

/// A link speed as the PCIe Link Status register encodes it, in GT/s.
pub(crate) fn speed_gt_s(encoding: u8) -> Option<f32> {
    LinkSpeed::from_encoding(encoding).map(|speed| speed.gigatransfers_per_second() as f32)
}

/// The fact in the kernel's tracepoint `event` (`ras:aer_event`,
/// `pci:pcie_link_event`) for a device whose path from its root port down
/// is `path` (the device last), if it concerns it: an error of any function
/// on the path, or a change of the link the device hangs from (the one of
/// the port right above it). The module's own events say nothing here.
pub(crate) fn tracefs_fact(event: &Event, path: &[String]) -> Option<TracefsFact> {
    if event.source != EventSource::Tracefs || !path.contains(&event.bdf) {
        return None;
    }
    match event.kind {
        EventKind::Aer if !event.errors.is_empty() => Some(TracefsFact::Error(Fault::error(
            event.bdf.clone(),
            event.errors.clone(),
        ))),
        EventKind::LinkChange if path.len() >= 2 && event.bdf == path[path.len() - 2] => {
            let after = event.link_after.as_ref()?;
            let speed_gt_s = speed_gt_s(after.speed)?;
            (after.width != 0).then_some(TracefsFact::Link {
                speed_gt_s,
                width: after.width,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_source::trace_text::{parse_line, to_event};
    use crate::events::Severity;

    /// The event the kernel's trace line becomes.
    fn traced(line: &str) -> Event {
        let record = parse_line(line).expect("parses").expect("a record");
        to_event(&record, 0, 0)
    }

    const PATH: [&str; 2] = ["0000:00:02.0", "0000:01:00.0"];

    #[test]
    fn errors_on_the_path_are_faults_and_others_are_not() {
        let path = PATH.map(str::to_owned).to_vec();
        let port = traced("irq/25-aerdrv-34 [001] ..... 4.917689: aer_event: 0000:00:02.0 PCIe Bus Error: severity=Corrected, Bad TLP, TLP Header=Not available");
        let device = traced("irq/25-aerdrv-34 [001] ..... 4.917689: aer_event: 0000:01:00.0 PCIe Bus Error: severity=Uncorrected, non-fatal, Completion Timeout, TLP Header=Not available");
        let elsewhere = traced("irq/25-aerdrv-34 [001] ..... 4.917689: aer_event: 0000:00:03.0 PCIe Bus Error: severity=Fatal, Surprise Down Error, TLP Header=Not available");
        match tracefs_fact(&port, &path) {
            Some(TracefsFact::Error(fault)) => {
                assert_eq!(fault.bdf, PATH[0]);
                assert_eq!(fault.errors[0].severity, Severity::Correctable);
            }
            other => panic!("the port's correctable error: {other:?}"),
        }
        match tracefs_fact(&device, &path) {
            Some(TracefsFact::Error(fault)) => {
                assert_eq!(fault.bdf, PATH[1]);
                assert_eq!(fault.errors[0].severity, Severity::NonFatal);
            }
            other => panic!("the device's non-fatal error: {other:?}"),
        }
        assert_eq!(tracefs_fact(&elsewhere, &path), None);
        let module = Event {
            source: EventSource::Module,
            ..device
        };
        assert_eq!(
            tracefs_fact(&module, &path),
            None,
            "the module's own events are its transport's"
        );
    }

    const LINK: &str = "              sh-58      [000] .....     5.103412: pcie_link_event: 0000:00:02.0 type:4, reason:1, cur_bus_speed:22, max_bus_speed:22, width:4, flit_mode:0, status:DLLLA";

    #[test]
    fn the_kernel_link_updates_of_the_port_above_set_speed_and_width() {
        let path = PATH.map(str::to_owned).to_vec();
        assert_eq!(
            tracefs_fact(&traced(LINK), &path),
            Some(TracefsFact::Link {
                speed_gt_s: 8.0,
                width: 4
            })
        );
        // The device's own link below it (it has none), or a port elsewhere:
        // not the link the device hangs from.
        let below = [PATH[1].to_owned()];
        assert_eq!(tracefs_fact(&traced(LINK), &below), None);
        let mut unknown = traced(LINK);
        unknown.link_after.as_mut().unwrap().speed = 0;
        assert_eq!(tracefs_fact(&unknown, &path), None);
    }
}
