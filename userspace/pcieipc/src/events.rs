//! The module's event records, decoded: AER error bits by the PCIe spec
//! (the positions of include/uapi/linux/pci_regs.h), severity from the
//! severity register, link changes, retrains, overflow. No I/O: records in,
//! values out (`device::Device::read_events` does the reading).

use std::fmt;

use pcieipc_uapi as uapi;
use serde::Serialize;

use crate::probe::link::LinkSpeed;

/// One AER status bit: position, the spec's name, the short name the
/// kernel's AER driver prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AerBit {
    pub bit: u8,
    pub name: &'static str,
    pub short: &'static str,
}

const fn bit(bit: u8, name: &'static str, short: &'static str) -> AerBit {
    AerBit { bit, name, short }
}

/// Uncorrectable Error Status bits (PCI Express Base spec, 7.8.4.2).
pub const UNCORRECTABLE: [AerBit; 17] = [
    bit(0, "Undefined", "Undefined"),
    bit(4, "Data Link Protocol Error", "DLP"),
    bit(5, "Surprise Down Error", "SDES"),
    bit(12, "Poisoned TLP", "TLP"),
    bit(13, "Flow Control Protocol Error", "FCP"),
    bit(14, "Completion Timeout", "CmpltTO"),
    bit(15, "Completer Abort", "CmpltAbrt"),
    bit(16, "Unexpected Completion", "UnxCmplt"),
    bit(17, "Receiver Overflow", "RxOF"),
    bit(18, "Malformed TLP", "MalfTLP"),
    bit(19, "ECRC Error", "ECRC"),
    bit(20, "Unsupported Request", "UnsupReq"),
    bit(21, "ACS Violation", "ACSViol"),
    bit(22, "Uncorrectable Internal Error", "UncorrIntErr"),
    bit(23, "MC Blocked TLP", "BlockedTLP"),
    bit(24, "AtomicOp Egress Blocked", "AtomicOpBlocked"),
    bit(25, "TLP Prefix Blocked", "TLPBlockedErr"),
];

/// Correctable Error Status bits (7.8.4.5).
pub const CORRECTABLE: [AerBit; 8] = [
    bit(0, "Receiver Error", "RxErr"),
    bit(6, "Bad TLP", "BadTLP"),
    bit(7, "Bad DLLP", "BadDLLP"),
    bit(8, "REPLAY_NUM Rollover", "Rollover"),
    bit(12, "Replay Timer Timeout", "Timeout"),
    bit(13, "Advisory Non-Fatal Error", "NonFatalErr"),
    bit(14, "Corrected Internal Error", "CorrIntErr"),
    bit(15, "Header Log Overflow", "HeaderOF"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Correctable,
    NonFatal,
    Fatal,
}

/// One error bit that was set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AerError {
    pub bit: u8,
    pub name: String,
    pub short: String,
    pub severity: Severity,
    /// Set in the mask register: logged but not reported.
    pub masked: bool,
}

/// The error a set status bit stands for: the spec's name and the kernel's
/// short name for known positions, the position otherwise.
pub fn aer_error_at(position: u8, severity: Severity, masked: bool) -> AerError {
    let (table, kind): (&[AerBit], &str) = if severity == Severity::Correctable {
        (&CORRECTABLE, "Correctable")
    } else {
        (&UNCORRECTABLE, "Uncorrectable")
    };
    let known = table.iter().find(|b| b.bit == position);
    AerError {
        bit: position,
        name: known.map_or_else(|| format!("{kind} bit {position}"), |b| b.name.into()),
        short: known.map_or_else(|| format!("bit{position}"), |b| b.short.into()),
        severity,
        masked,
    }
}

/// The errors an AER register snapshot holds: uncorrectable bits with their
/// severity from the severity register (a set bit there means fatal), then
/// correctable bits. Unknown set bits are reported by position.
pub fn decode_aer(regs: &uapi::pcieipc_aer_regs) -> Vec<AerError> {
    let mut errors = Vec::new();
    for position in 0..32u8 {
        let mask = 1u32 << position;
        if regs.uncor_status & mask != 0 {
            let severity = if regs.uncor_severity & mask != 0 {
                Severity::Fatal
            } else {
                Severity::NonFatal
            };
            errors.push(aer_error_at(
                position,
                severity,
                regs.uncor_mask & mask != 0,
            ));
        }
    }
    for position in 0..32u8 {
        let mask = 1u32 << position;
        if regs.cor_status & mask != 0 {
            errors.push(aer_error_at(
                position,
                Severity::Correctable,
                regs.cor_mask & mask != 0,
            ));
        }
    }
    errors
}

/// The errors of one status word whose bits all have `severity` (what the
/// kernel's AER report and its counters give: status already masked).
pub fn decode_status(status: u32, severity: Severity) -> Vec<AerError> {
    (0..32u8)
        .filter(|position| status & (1 << position) != 0)
        .map(|position| aer_error_at(position, severity, false))
        .collect()
}

/// The First Error Pointer (AER Capabilities and Control bits 4:0), when it
/// points at an uncorrectable status bit that is set.
pub fn first_error_pointer(regs: &uapi::pcieipc_aer_regs) -> Option<u8> {
    let pointer = (regs.cap_control & 0x1f) as u8;
    (regs.present != 0 && regs.uncor_status & (1 << pointer) != 0).then_some(pointer)
}

/// `PCIEIPC_BDF` to "dddd:bb:dd.f", "-" for `PCIEIPC_BDF_NONE`.
pub fn bdf_string(bdf: u32) -> String {
    if bdf == uapi::PCIEIPC_BDF_NONE {
        return "-".into();
    }
    crate::probe::bdf::Bdf::from_abi(bdf).to_string()
}

/// A link as the module decoded it (tracefs link events fill speed, width,
/// max_speed and the port's link status; the rest stays 0).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Link {
    pub bdf: String,
    pub upstream_port: String,
    /// Generations: 1 = 2.5 GT/s ... 6 = 64 GT/s; 0 unknown.
    pub speed: u8,
    pub width: u8,
    pub max_speed: u8,
    pub max_width: u8,
    pub target_speed: u8,
    pub degraded: bool,
    pub training: bool,
    pub dll_link_active: bool,
    pub device_pcie: bool,
    pub port_lnkcap: u32,
    pub port_lnksta: u16,
    pub port_lnkctl: u16,
    pub port_lnkctl2: u16,
    pub device_lnkcap: u32,
    pub device_lnksta: u16,
}

impl Link {
    pub fn from_abi(s: &uapi::pcieipc_link_status) -> Self {
        Self {
            bdf: bdf_string(s.bdf),
            upstream_port: bdf_string(s.upstream_bdf),
            speed: s.cur_speed,
            width: s.cur_width,
            max_speed: s.max_speed,
            max_width: s.max_width,
            target_speed: s.target_speed,
            degraded: s.state & uapi::PCIEIPC_LINK_DEGRADED != 0,
            training: s.state & uapi::PCIEIPC_LINK_TRAINING != 0,
            dll_link_active: s.state & uapi::PCIEIPC_LINK_DLL_ACTIVE != 0,
            device_pcie: s.device.present != 0,
            port_lnkcap: s.port.lnkcap,
            port_lnksta: s.port.lnksta,
            port_lnkctl: s.port.lnkctl,
            port_lnkctl2: s.port.lnkctl2,
            device_lnkcap: s.device.lnkcap,
            device_lnksta: s.device.lnksta,
        }
    }
}

/// GT/s of a speed generation (1 = 2.5 GT/s ... 6 = 64 GT/s), as lspci prints it.
pub fn speed_gts(generation: u8) -> String {
    LinkSpeed::from_encoding(generation).map_or_else(
        || "unknown".into(),
        |speed| format!("{}GT/s", speed.gigatransfers_per_second()),
    )
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (port {}): {} x{}",
            self.bdf,
            self.upstream_port,
            speed_gts(self.speed),
            self.width
        )?;
        if self.max_speed == 0 {
            write!(f, ", capability unknown")?;
        } else {
            write!(f, " of {} x{}", speed_gts(self.max_speed), self.max_width)?;
        }
        if self.target_speed != 0 {
            write!(f, ", target {}", speed_gts(self.target_speed))?;
        }
        if self.degraded {
            write!(f, " DEGRADED")?;
        }
        if self.training {
            write!(f, " training")?;
        }
        Ok(())
    }
}

/// Where an event came from: the module's `/dev/pcieipc` (devices it binds),
/// the kernel's tracepoints read through tracefs (`ras:aer_event`,
/// `pci:pcie_link_event`: every device), or the kernel's `aer_dev_*`
/// counters in sysfs (every device, where tracing is unavailable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventSource {
    Module,
    Tracefs,
    Counters,
}

impl EventSource {
    pub fn name(self) -> &'static str {
        match self {
            EventSource::Module => "module",
            EventSource::Tracefs => "tracefs",
            EventSource::Counters => "counters",
        }
    }
}

impl fmt::Display for EventSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Overflow,
    Aer,
    LinkChange,
    DeviceGone,
    LinkRetrain,
    Reset,
    Unknown,
}

/// One decoded event record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// The source's own sequence number (the module's, or one counted by
    /// the tracefs or counters reader from 0).
    pub seq: u64,
    /// CLOCK_MONOTONIC, nanoseconds (tracefs: microsecond resolution;
    /// counters: when the poll saw the change).
    pub timestamp_ns: u64,
    pub kind: EventKind,
    pub bdf: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aer_step: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel_state: Option<&'static str>,
    /// AER: the pci_ers_result name; retrain/reset: "ok" or the errno.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<AerError>,
    /// The uncorrectable error the AER capability's First Error Pointer
    /// names: the one that was reported now, where status bits of earlier
    /// errors may still be set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aer_source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_before: Option<Link>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_after: Option<Link>,
    /// tracefs link events: why the kernel updated the link (retrain,
    /// add_bus, bwctrl_enable, bwctrl_irq, hotplug).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Counters: how many errors the counters rose by since the last poll.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub occurrences: Option<u64>,
    pub source: EventSource,
}

impl Event {
    /// An event of `source` with nothing but its kind, device and time set.
    pub fn new(source: EventSource, kind: EventKind, bdf: String, timestamp_ns: u64) -> Self {
        Event {
            seq: 0,
            timestamp_ns,
            kind,
            bdf,
            lost: None,
            aer_step: None,
            channel_state: None,
            result: None,
            errors: Vec::new(),
            first_error: None,
            aer_source: None,
            link_before: None,
            link_after: None,
            reason: None,
            occurrences: None,
            source,
        }
    }
}

fn aer_step_name(step: u32) -> Option<&'static str> {
    Some(match step {
        uapi::PCIEIPC_AER_COR_ERROR_DETECTED => "cor_error_detected",
        uapi::PCIEIPC_AER_ERROR_DETECTED => "error_detected",
        uapi::PCIEIPC_AER_MMIO_ENABLED => "mmio_enabled",
        uapi::PCIEIPC_AER_SLOT_RESET => "slot_reset",
        uapi::PCIEIPC_AER_RESUME => "resume",
        _ => return None,
    })
}

fn channel_state_name(state: u32) -> Option<&'static str> {
    Some(match state {
        1 => "normal",
        2 => "frozen",
        3 => "permanent_failure",
        _ => return None,
    })
}

/// The kernel's `pci_ers_result` values (include/linux/pci.h).
fn ers_result_name(result: u32) -> String {
    match result {
        1 => "none",
        2 => "can_recover",
        3 => "need_reset",
        4 => "disconnect",
        5 => "recovered",
        6 => "no_aer_driver",
        _ => return format!("result {result}"),
    }
    .into()
}

impl Event {
    pub fn from_abi(e: &uapi::pcieipc_event) -> Self {
        let kind = match e.kind {
            uapi::PCIEIPC_EVENT_OVERFLOW => EventKind::Overflow,
            uapi::PCIEIPC_EVENT_AER => EventKind::Aer,
            uapi::PCIEIPC_EVENT_LINK_CHANGE => EventKind::LinkChange,
            uapi::PCIEIPC_EVENT_DEVICE_GONE => EventKind::DeviceGone,
            uapi::PCIEIPC_EVENT_LINK_RETRAIN => EventKind::LinkRetrain,
            uapi::PCIEIPC_EVENT_RESET => EventKind::Reset,
            _ => EventKind::Unknown,
        };
        let has_link = matches!(
            kind,
            EventKind::LinkChange | EventKind::DeviceGone | EventKind::LinkRetrain
        );
        let errno_result = |r: u32| {
            if r == 0 {
                "ok".to_string()
            } else {
                nix::errno::Errno::from_raw(-(r as i32)).to_string()
            }
        };
        Event {
            seq: e.seq,
            timestamp_ns: e.timestamp_ns,
            kind,
            bdf: bdf_string(e.bdf),
            lost: (kind == EventKind::Overflow).then_some(e.lost),
            aer_step: if kind == EventKind::Aer {
                aer_step_name(e.aer_step)
            } else {
                None
            },
            channel_state: if kind == EventKind::Aer {
                channel_state_name(e.channel_state)
            } else {
                None
            },
            result: match kind {
                EventKind::Aer => Some(ers_result_name(e.result)),
                EventKind::LinkRetrain | EventKind::Reset => Some(errno_result(e.result)),
                _ => None,
            },
            errors: if e.aer.present != 0 {
                decode_aer(&e.aer)
            } else {
                Vec::new()
            },
            first_error: first_error_pointer(&e.aer),
            aer_source: (e.aer.present != 0).then(|| bdf_string(e.aer.source_bdf)),
            link_before: has_link.then(|| Link::from_abi(&e.link_before)),
            link_after: has_link.then(|| Link::from_abi(&e.link_after)),
            reason: None,
            occurrences: None,
            source: EventSource::Module,
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The source first: a line that starts with "[ seconds]" would read
        // as one of the kernel's own console lines.
        let seconds = self.timestamp_ns as f64 / 1e9;
        write!(
            f,
            "{:<8} [{seconds:12.6}] #{} {}",
            self.source.name(),
            self.seq,
            self.bdf
        )?;
        match self.kind {
            EventKind::Overflow => write!(f, " OVERFLOW: {} events lost", self.lost.unwrap_or(0))?,
            EventKind::Aer => match self.aer_step {
                Some(step) => write!(
                    f,
                    " AER {step} (channel {}) -> {}",
                    self.channel_state.unwrap_or("?"),
                    self.result.as_deref().unwrap_or("?")
                )?,
                // tracefs and counters: the kernel's report, no driver step.
                None => match self.occurrences {
                    Some(count) => write!(f, " AER reported x{count}")?,
                    None => write!(f, " AER reported")?,
                },
            },
            EventKind::LinkChange => match &self.reason {
                Some(reason) => write!(f, " LINK_CHANGE ({reason})")?,
                None => write!(f, " LINK_CHANGE")?,
            },
            EventKind::DeviceGone => write!(f, " DEVICE_GONE")?,
            EventKind::LinkRetrain => write!(
                f,
                " LINK_RETRAIN -> {}",
                self.result.as_deref().unwrap_or("?")
            )?,
            EventKind::Reset => write!(f, " RESET -> {}", self.result.as_deref().unwrap_or("?"))?,
            EventKind::Unknown => write!(f, " unknown event")?,
        }
        if let (Some(before), Some(after)) = (&self.link_before, &self.link_after) {
            write!(
                f,
                ": {} x{} -> {} x{}",
                speed_gts(before.speed),
                before.width,
                speed_gts(after.speed),
                after.width
            )?;
            if after.degraded {
                write!(f, " DEGRADED")?;
            }
        } else if let Some(after) = &self.link_after {
            write!(f, ": {} x{}", speed_gts(after.speed), after.width)?;
            if after.max_speed != 0 {
                write!(f, " of {}", speed_gts(after.max_speed))?;
            }
            if after.degraded {
                write!(f, " DEGRADED")?;
            }
        }
        for error in &self.errors {
            let severity = match error.severity {
                Severity::Correctable => "correctable",
                Severity::NonFatal => "non-fatal",
                Severity::Fatal => "fatal",
            };
            let first =
                error.severity != Severity::Correctable && self.first_error == Some(error.bit);
            write!(
                f,
                " [{}] {} ({severity}{}{})",
                error.bit,
                error.short,
                if first { ", first" } else { "" },
                if error.masked { ", masked" } else { "" }
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_bit_positions() {
        // include/uapi/linux/pci_regs.h: PCI_ERR_UNC_* and PCI_ERR_COR_*.
        let unc = |name: &str| UNCORRECTABLE.iter().find(|b| b.short == name).unwrap().bit;
        assert_eq!(unc("DLP"), 4);
        assert_eq!(unc("SDES"), 5);
        assert_eq!(unc("TLP"), 12);
        assert_eq!(unc("FCP"), 13);
        assert_eq!(unc("CmpltTO"), 14);
        assert_eq!(unc("CmpltAbrt"), 15);
        assert_eq!(unc("UnxCmplt"), 16);
        assert_eq!(unc("RxOF"), 17);
        assert_eq!(unc("MalfTLP"), 18);
        assert_eq!(unc("ECRC"), 19);
        assert_eq!(unc("UnsupReq"), 20);
        assert_eq!(unc("ACSViol"), 21);
        let cor = |name: &str| CORRECTABLE.iter().find(|b| b.short == name).unwrap().bit;
        assert_eq!(cor("RxErr"), 0);
        assert_eq!(cor("BadTLP"), 6);
        assert_eq!(cor("BadDLLP"), 7);
        assert_eq!(cor("Rollover"), 8);
        assert_eq!(cor("Timeout"), 12);
        assert_eq!(cor("NonFatalErr"), 13);
    }

    #[test]
    fn severity_comes_from_the_severity_register() {
        // Completion Timeout (14) and Malformed TLP (18) set; only 18 is
        // marked fatal in the severity register; Bad TLP correctable, masked.
        let regs = uapi::pcieipc_aer_regs {
            uncor_status: 1 << 14 | 1 << 18,
            uncor_severity: 1 << 18 | 1 << 5,
            cor_status: 1 << 6,
            cor_mask: 1 << 6,
            present: 1,
            ..Default::default()
        };
        let errors = decode_aer(&regs);
        let summary: Vec<(u8, &str, Severity, bool)> = errors
            .iter()
            .map(|e| (e.bit, e.short.as_str(), e.severity, e.masked))
            .collect();
        assert_eq!(
            summary,
            [
                (14, "CmpltTO", Severity::NonFatal, false),
                (18, "MalfTLP", Severity::Fatal, false),
                (6, "BadTLP", Severity::Correctable, true),
            ]
        );
    }

    #[test]
    fn first_error_pointer_names_the_new_error() {
        // Data Link Protocol (4) still set from an earlier error; the First
        // Error Pointer says Completion Timeout (14) is the one reported now.
        let regs = uapi::pcieipc_aer_regs {
            uncor_status: 1 << 4 | 1 << 14,
            cap_control: 0xa0 | 14,
            present: 1,
            ..Default::default()
        };
        assert_eq!(first_error_pointer(&regs), Some(14));
        let stale = uapi::pcieipc_aer_regs {
            uncor_status: 1 << 4,
            cap_control: 14,
            present: 1,
            ..Default::default()
        };
        assert_eq!(first_error_pointer(&stale), None);
    }

    #[test]
    fn speeds_print_as_lspci_does() {
        assert_eq!(speed_gts(1), "2.5GT/s");
        assert_eq!(speed_gts(4), "16GT/s");
        assert_eq!(speed_gts(0), "unknown");
    }

    #[test]
    fn bdf_strings() {
        assert_eq!(bdf_string(0x0001_3b09), "0001:3b:01.1");
        assert_eq!(bdf_string(uapi::PCIEIPC_BDF_NONE), "-");
    }

    #[test]
    fn overflow_and_retrain_records() {
        let overflow = Event::from_abi(&uapi::pcieipc_event {
            seq: 7,
            kind: uapi::PCIEIPC_EVENT_OVERFLOW,
            bdf: uapi::PCIEIPC_BDF_NONE,
            lost: 2304,
            ..Default::default()
        });
        assert_eq!(overflow.kind, EventKind::Overflow);
        assert_eq!(overflow.lost, Some(2304));
        assert!(overflow.to_string().contains("OVERFLOW: 2304 events lost"));
        let json = serde_json::to_value(&overflow).unwrap();
        assert_eq!(json["kind"], "overflow");
        assert_eq!(json["lost"], 2304);

        let retrain = Event::from_abi(&uapi::pcieipc_event {
            kind: uapi::PCIEIPC_EVENT_LINK_RETRAIN,
            bdf: 0x80,
            result: (-110i32) as u32,
            link_after: uapi::pcieipc_link_status {
                cur_speed: 1,
                cur_width: 1,
                max_speed: 4,
                max_width: 16,
                state: uapi::PCIEIPC_LINK_DEGRADED,
                ..Default::default()
            },
            ..Default::default()
        });
        assert_eq!(
            retrain.result.as_deref(),
            Some("ETIMEDOUT: Connection timed out")
        );
        assert!(retrain.link_after.as_ref().unwrap().degraded);
    }
}
