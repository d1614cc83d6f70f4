//! The text of a tracefs `trace_pipe` with the kernel's `ras:aer_event` and
//! `pci:pcie_link_event` tracepoints, parsed into event records. No I/O:
//! lines in, records out (`tracefs` does the reading).
//!
//! The formats are the kernel's TP_printk (include/ras/ras_event.h,
//! include/trace/events/pci.h, 7.3):
//!
//! ```text
//! <task>-<pid> [<cpu>] <flags> <seconds>.<micros>: aer_event: <dev> <bus> Bus Error: severity=<Corrected|Fatal|Uncorrected, non-fatal>, <names joined by |>, TLP Header=<...>
//! <task>-<pid> [<cpu>] <flags> <seconds>.<micros>: pcie_link_event: <port> type:<n>, reason:<n>, cur_bus_speed:<n>, max_bus_speed:<n>, width:<n>, flit_mode:<n>, status:<LT|DLLLA|LBMS|LABS>
//! CPU:<cpu> [LOST <n> EVENTS]
//! ```
//!
//! The error names are the kernel's `aer_correctable_errors` and
//! `aer_uncorrectable_errors` tables; bits without a name print as one hex
//! remainder (`0x...`), which is decoded by position too.

use crate::events::{decode_status, Event, EventKind, EventSource, Link, Severity};
use crate::probe::bdf::Bdf;

/// The names `ras:aer_event` prints for correctable status bits, by position.
const TRACE_CORRECTABLE: [(u8, &str); 8] = [
    (0, "Receiver Error"),
    (6, "Bad TLP"),
    (7, "Bad DLLP"),
    // Sic: the kernel's table spells REPLAY_NUM this way.
    (8, "RELAY_NUM Rollover"),
    (12, "Replay Timer Timeout"),
    (13, "Advisory Non-Fatal Error"),
    (14, "Corrected Internal Error"),
    (15, "Header Log Overflow"),
];

/// The names `ras:aer_event` prints for uncorrectable status bits.
const TRACE_UNCORRECTABLE: [(u8, &str); 17] = [
    (0, "Undefined"),
    (4, "Data Link Protocol Error"),
    (5, "Surprise Down Error"),
    (12, "Poisoned TLP"),
    (13, "Flow Control Protocol Error"),
    (14, "Completion Timeout"),
    (15, "Completer Abort"),
    (16, "Unexpected Completion"),
    (17, "Receiver Overflow"),
    (18, "Malformed TLP"),
    (19, "ECRC Error"),
    (20, "Unsupported Request Error"),
    (21, "ACS Violation"),
    (22, "Uncorrectable Internal Error"),
    (23, "MC Blocked TLP"),
    (24, "AtomicOp Egress Blocked"),
    (25, "TLP Prefix Blocked Error"),
];

/// Link Status bits `pci:pcie_link_event` names (PCI_EXP_LNKSTA_*).
const LNKSTA_FLAGS: [(u16, &str); 4] = [
    (0x0800, "LT"),
    (0x2000, "DLLLA"),
    (0x4000, "LBMS"),
    (0x8000, "LABS"),
];

/// One tracepoint record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceRecord {
    Aer {
        timestamp_ns: u64,
        device: String,
        /// "PCIe" or "CXL".
        bus_type: String,
        severity: Severity,
        /// The status register's bits the kernel reported (already masked).
        status: u32,
    },
    Link {
        timestamp_ns: u64,
        port: String,
        /// `pci_pcie_type` of the port (4 root port, 6 downstream port...).
        port_type: u32,
        /// `enum pcie_link_change_reason`.
        reason: u32,
        /// `enum pci_bus_speed` values.
        cur_bus_speed: u32,
        max_bus_speed: u32,
        width: u32,
        flit_mode: u32,
        /// Link Status bits (LT, DLLLA, LBMS, LABS).
        link_status: u16,
    },
    /// The ring buffer overwrote records before they were read.
    Lost { cpu: u32, lost: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed trace line ({what}): {line:?}")]
pub struct TraceParseError {
    pub what: &'static str,
    pub line: String,
}

fn malformed(what: &'static str, line: &str) -> TraceParseError {
    TraceParseError {
        what,
        line: line.to_string(),
    }
}

/// Parses one line of `trace_pipe`: `Ok(None)` for blank lines and other
/// events' lines, an error for a line of ours that does not parse.
pub fn parse_line(line: &str) -> Result<Option<TraceRecord>, TraceParseError> {
    let line = line.trim_end_matches(['\n', '\r']);
    if line.trim().is_empty() {
        return Ok(None);
    }
    if let Some(rest) = line.trim_start().strip_prefix("CPU:") {
        return parse_lost(rest, line).map(Some);
    }
    for (name, parse) in [
        (": aer_event: ", parse_aer as fn(u64, &str, &str) -> _),
        (": pcie_link_event: ", parse_link),
    ] {
        if let Some(at) = line.find(name) {
            let timestamp_ns = parse_timestamp(&line[..at], line)?;
            return parse(timestamp_ns, &line[at + name.len()..], line).map(Some);
        }
    }
    Ok(None)
}

/// "CPU:1 [LOST 27 EVENTS]" (after "CPU:").
fn parse_lost(rest: &str, line: &str) -> Result<TraceRecord, TraceParseError> {
    const WHAT: &str = "expected CPU:<n> [LOST <n> EVENTS]";
    let (cpu, rest) = rest.split_once(' ').ok_or_else(|| malformed(WHAT, line))?;
    let lost = rest
        .trim()
        .strip_prefix("[LOST ")
        .and_then(|r| r.strip_suffix(" EVENTS]"))
        .ok_or_else(|| malformed(WHAT, line))?;
    Ok(TraceRecord::Lost {
        cpu: cpu.parse().map_err(|_| malformed(WHAT, line))?,
        lost: lost.parse().map_err(|_| malformed(WHAT, line))?,
    })
}

/// The context before the event name ends with "<seconds>.<fraction>": the
/// trace clock in seconds (an instance with trace_clock "mono" prints
/// CLOCK_MONOTONIC with microseconds).
fn parse_timestamp(context: &str, line: &str) -> Result<u64, TraceParseError> {
    const WHAT: &str =
        "no <seconds>.<fraction> timestamp before the event name (trace_clock must count in ns)";
    let token = context
        .split_whitespace()
        .next_back()
        .ok_or_else(|| malformed(WHAT, line))?;
    let (seconds, fraction) = token.split_once('.').ok_or_else(|| malformed(WHAT, line))?;
    if fraction.is_empty()
        || fraction.len() > 9
        || !fraction.bytes().all(|b| b.is_ascii_digit())
        || !seconds.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(malformed(WHAT, line));
    }
    let seconds: u64 = seconds.parse().map_err(|_| malformed(WHAT, line))?;
    let fraction: u64 = format!("{fraction:0<9}")
        .parse()
        .map_err(|_| malformed(WHAT, line))?;
    seconds
        .checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(fraction))
        .ok_or_else(|| malformed(WHAT, line))
}

fn parse_device(text: &str, line: &str) -> Result<String, TraceParseError> {
    text.parse::<Bdf>()
        .map(|_| text.to_string())
        .map_err(|_| malformed("device is not a PCI address", line))
}

/// "<dev> <bus> Bus Error: severity=<sev>, <names>, TLP Header=<...>"
fn parse_aer(timestamp_ns: u64, payload: &str, line: &str) -> Result<TraceRecord, TraceParseError> {
    const WHAT: &str = "expected <dev> <bus> Bus Error: severity=..., <errors>, TLP Header=...";
    let (device, rest) = payload
        .split_once(' ')
        .ok_or_else(|| malformed(WHAT, line))?;
    let device = parse_device(device, line)?;
    let (bus_type, rest) = rest
        .split_once(" Bus Error: severity=")
        .ok_or_else(|| malformed(WHAT, line))?;
    let (severity, rest) = [
        ("Corrected, ", Severity::Correctable),
        ("Fatal, ", Severity::Fatal),
        ("Uncorrected, non-fatal, ", Severity::NonFatal),
    ]
    .into_iter()
    .find_map(|(prefix, severity)| rest.strip_prefix(prefix).map(|rest| (severity, rest)))
    .ok_or_else(|| malformed("unknown severity", line))?;
    let (names, _tlp_header) = rest
        .rsplit_once(", TLP Header=")
        .ok_or_else(|| malformed(WHAT, line))?;
    let table: &[(u8, &str)] = if severity == Severity::Correctable {
        &TRACE_CORRECTABLE
    } else {
        &TRACE_UNCORRECTABLE
    };
    let mut status = 0u32;
    for name in names.split('|').filter(|n| !n.is_empty()) {
        status |= match table.iter().find(|(_, known)| *known == name) {
            Some((bit, _)) => 1 << bit,
            None => name
                .strip_prefix("0x")
                .and_then(|hex| u32::from_str_radix(hex, 16).ok())
                .ok_or_else(|| malformed("unknown AER error name", line))?,
        };
    }
    Ok(TraceRecord::Aer {
        timestamp_ns,
        device,
        bus_type: bus_type.to_string(),
        severity,
        status,
    })
}

/// "<port> type:4, reason:0, cur_bus_speed:20, max_bus_speed:20, width:1, flit_mode:0, status:DLLLA"
fn parse_link(
    timestamp_ns: u64,
    payload: &str,
    line: &str,
) -> Result<TraceRecord, TraceParseError> {
    const WHAT: &str = "expected <port> type:, reason:, cur_bus_speed:, max_bus_speed:, width:, flit_mode:, status:";
    let (port, rest) = payload
        .split_once(' ')
        .ok_or_else(|| malformed(WHAT, line))?;
    let port = parse_device(port, line)?;
    let mut numbers = [0u32; 6];
    let mut fields = rest.split(", ");
    for (slot, key) in numbers.iter_mut().zip([
        "type:",
        "reason:",
        "cur_bus_speed:",
        "max_bus_speed:",
        "width:",
        "flit_mode:",
    ]) {
        *slot = fields
            .next()
            .and_then(|field| field.strip_prefix(key))
            .and_then(|value| value.trim().parse().ok())
            .ok_or_else(|| malformed(WHAT, line))?;
    }
    let status = fields
        .next()
        .and_then(|field| field.strip_prefix("status:"))
        .ok_or_else(|| malformed(WHAT, line))?;
    if fields.next().is_some() {
        return Err(malformed(WHAT, line));
    }
    let mut link_status = 0u16;
    for name in status.trim().split('|').filter(|n| !n.is_empty()) {
        link_status |= match LNKSTA_FLAGS.iter().find(|(_, known)| *known == name) {
            Some((bits, _)) => *bits,
            None => name
                .strip_prefix("0x")
                .and_then(|hex| u16::from_str_radix(hex, 16).ok())
                .ok_or_else(|| malformed("unknown link status flag", line))?,
        };
    }
    let [port_type, reason, cur_bus_speed, max_bus_speed, width, flit_mode] = numbers;
    Ok(TraceRecord::Link {
        timestamp_ns,
        port,
        port_type,
        reason,
        cur_bus_speed,
        max_bus_speed,
        width,
        flit_mode,
        link_status,
    })
}

/// `enum pci_bus_speed` (include/linux/pci.h) to a speed generation (1 =
/// 2.5 GT/s ... 6 = 64 GT/s), 0 for anything else (conventional PCI, unknown).
pub fn bus_speed_generation(speed: u32) -> u8 {
    match speed {
        0x14..=0x19 => (speed - 0x13) as u8,
        _ => 0,
    }
}

/// `enum pcie_link_change_reason` (drivers/pci/pci.h).
pub fn link_reason_name(reason: u32) -> String {
    match reason {
        0 => "retrain".into(),
        1 => "add_bus".into(),
        2 => "bwctrl_enable".into(),
        3 => "bwctrl_irq".into(),
        4 => "hotplug".into(),
        other => format!("reason {other}"),
    }
}

/// The event record of a tracepoint record: AER with the decoded bits and
/// their severity, LINK_CHANGE with the port's link after the change,
/// OVERFLOW for lost records (at `now_ns`: they carry no time).
pub fn to_event(record: &TraceRecord, seq: u64, now_ns: u64) -> Event {
    let mut event = match record {
        TraceRecord::Aer {
            timestamp_ns,
            device,
            severity,
            status,
            ..
        } => {
            let mut event = Event::new(
                EventSource::Tracefs,
                EventKind::Aer,
                device.clone(),
                *timestamp_ns,
            );
            event.errors = decode_status(*status, *severity);
            event
        }
        TraceRecord::Link {
            timestamp_ns,
            port,
            reason,
            cur_bus_speed,
            max_bus_speed,
            width,
            link_status,
            ..
        } => {
            let speed = bus_speed_generation(*cur_bus_speed);
            let max_speed = bus_speed_generation(*max_bus_speed);
            let mut event = Event::new(
                EventSource::Tracefs,
                EventKind::LinkChange,
                port.clone(),
                *timestamp_ns,
            );
            event.reason = Some(link_reason_name(*reason));
            event.link_after = Some(Link {
                bdf: port.clone(),
                upstream_port: "-".into(),
                speed,
                width: (*width).min(u8::MAX as u32) as u8,
                max_speed,
                degraded: speed != 0 && max_speed != 0 && speed < max_speed,
                training: link_status & 0x0800 != 0,
                dll_link_active: link_status & 0x2000 != 0,
                port_lnksta: *link_status,
                ..Link::default()
            });
            event
        }
        TraceRecord::Lost { cpu, lost } => {
            let mut event = Event::new(
                EventSource::Tracefs,
                EventKind::Overflow,
                format!("cpu{cpu}"),
                now_ns,
            );
            event.lost = Some(*lost);
            event
        }
    };
    event.seq = seq;
    event
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines of trace_pipe copied from the testbed's 7.3 kernel (an instance
    // with trace_clock "mono"): QEMU's pcie_aer_inject_error on root port
    // 00:11.0 (COMP_TIME, BAD_TLP, MALF_TLP, RCVR, then a status with a TLP
    // header), COMP_TIME on 00:10.0, and the port removed and rescanned.
    const NONFATAL: &str = "   irq/25-aerdrv-34      [001] .....     4.917689: aer_event: 0000:00:11.0 PCIe Bus Error: severity=Uncorrected, non-fatal, Completion Timeout, TLP Header=Not available";
    const CORRECTABLE: &str = "   irq/25-aerdrv-34      [001] .....     4.954258: aer_event: 0000:00:11.0 PCIe Bus Error: severity=Corrected, Bad TLP, TLP Header=Not available";
    const FATAL: &str = "   irq/25-aerdrv-34      [001] .....     4.977176: aer_event: 0000:00:11.0 PCIe Bus Error: severity=Fatal, Completion Timeout|Malformed TLP, TLP Header={0x0,0x0,0x0,0x0,0x0,0x0,0x0,0x0,0x0,0x0,0x0,0x0,0x0,0x0}";
    const OTHER_PORT: &str = "   irq/24-aerdrv-32      [000] .....     5.019129: aer_event: 0000:00:10.0 PCIe Bus Error: severity=Uncorrected, non-fatal, Completion Timeout, TLP Header=Not available";
    const RECEIVER: &str = "   irq/25-aerdrv-34      [001] .....     5.070893: aer_event: 0000:00:11.0 PCIe Bus Error: severity=Corrected, Receiver Error, TLP Header=Not available";
    const WITH_HEADER: &str = "   irq/25-aerdrv-34      [001] .....     5.132963: aer_event: 0000:00:11.0 PCIe Bus Error: severity=Uncorrected, non-fatal, Completion Timeout|Malformed TLP, TLP Header={0x100004a,0xf000001,0x300000,0x0,0x0,0x0,0x0,0x0,0x0,0x0,0x0,0x0,0x0,0x0}";
    const LINK_ADD_BUS: &str = "              sh-58      [000] .....     5.103412: pcie_link_event: 0000:00:11.0 type:4, reason:1, cur_bus_speed:22, max_bus_speed:22, width:4, flit_mode:0, status:DLLLA";
    const LINK_BWCTRL: &str = "              sh-58      [000] .....     5.146727: pcie_link_event: 0000:00:11.0 type:4, reason:2, cur_bus_speed:22, max_bus_speed:22, width:4, flit_mode:0, status:DLLLA";

    fn bits(event: &Event) -> Vec<(u8, &str, Severity)> {
        event
            .errors
            .iter()
            .map(|e| (e.bit, e.short.as_str(), e.severity))
            .collect()
    }

    fn event_of(line: &str) -> Event {
        to_event(&parse_line(line).unwrap().unwrap(), 7, 0)
    }

    #[test]
    fn aer_lines_decode_to_spec_bits_and_severity() {
        let event = event_of(NONFATAL);
        assert_eq!(event.source, EventSource::Tracefs);
        assert_eq!(event.kind, EventKind::Aer);
        assert_eq!(event.bdf, "0000:00:11.0");
        assert_eq!(event.seq, 7);
        assert_eq!(event.timestamp_ns, 4_917_689_000);
        assert_eq!(bits(&event), [(14, "CmpltTO", Severity::NonFatal)]);
        assert_eq!(event.aer_step, None);

        assert_eq!(
            bits(&event_of(CORRECTABLE)),
            [(6, "BadTLP", Severity::Correctable)]
        );
        assert_eq!(
            bits(&event_of(RECEIVER)),
            [(0, "RxErr", Severity::Correctable)]
        );
        assert_eq!(
            bits(&event_of(FATAL)),
            [
                (14, "CmpltTO", Severity::Fatal),
                (18, "MalfTLP", Severity::Fatal)
            ]
        );
        assert_eq!(
            bits(&event_of(WITH_HEADER)),
            [
                (14, "CmpltTO", Severity::NonFatal),
                (18, "MalfTLP", Severity::NonFatal)
            ]
        );
        assert_eq!(event_of(OTHER_PORT).bdf, "0000:00:10.0");
        assert_eq!(event_of(OTHER_PORT).timestamp_ns, 5_019_129_000);
    }

    #[test]
    fn aer_record_fields() {
        assert_eq!(
            parse_line(FATAL).unwrap(),
            Some(TraceRecord::Aer {
                timestamp_ns: 4_977_176_000,
                device: "0000:00:11.0".into(),
                bus_type: "PCIe".into(),
                severity: Severity::Fatal,
                status: 1 << 14 | 1 << 18,
            })
        );
    }

    #[test]
    fn aer_events_print_and_serialize_with_their_source() {
        let event = event_of(NONFATAL);
        assert_eq!(
            event.to_string(),
            "tracefs  [    4.917689] #7 0000:00:11.0 AER reported [14] CmpltTO (non-fatal)"
        );
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["source"], "tracefs");
        assert_eq!(json["kind"], "aer");
        assert_eq!(json["errors"][0]["bit"], 14);
        assert_eq!(json["errors"][0]["severity"], "non_fatal");
        assert!(json.get("aer_step").is_none());
    }

    #[test]
    fn link_lines_give_the_port_link() {
        assert_eq!(
            parse_line(LINK_ADD_BUS).unwrap(),
            Some(TraceRecord::Link {
                timestamp_ns: 5_103_412_000,
                port: "0000:00:11.0".into(),
                port_type: 4,
                reason: 1,
                cur_bus_speed: 22,
                max_bus_speed: 22,
                width: 4,
                flit_mode: 0,
                link_status: 0x2000,
            })
        );
        let event = event_of(LINK_BWCTRL);
        assert_eq!(event.kind, EventKind::LinkChange);
        assert_eq!(event.bdf, "0000:00:11.0");
        assert_eq!(event.reason.as_deref(), Some("bwctrl_enable"));
        let link = event.link_after.as_ref().unwrap();
        assert_eq!((link.speed, link.width, link.max_speed), (3, 4, 3));
        assert!(link.dll_link_active && !link.training && !link.degraded);
        assert_eq!(
            event.to_string(),
            "tracefs  [    5.146727] #7 0000:00:11.0 LINK_CHANGE (bwctrl_enable): 8GT/s x4 of 8GT/s"
        );
    }

    #[test]
    fn speeds_and_reasons() {
        assert_eq!(bus_speed_generation(0x14), 1);
        assert_eq!(bus_speed_generation(0x17), 4);
        assert_eq!(bus_speed_generation(0x19), 6);
        assert_eq!(bus_speed_generation(0xff), 0);
        assert_eq!(link_reason_name(0), "retrain");
        assert_eq!(link_reason_name(4), "hotplug");
        assert_eq!(link_reason_name(9), "reason 9");
    }

    #[test]
    fn unnamed_bits_and_empty_status_and_lost_records() {
        let line = NONFATAL.replace("Completion Timeout,", "Completion Timeout|0x4000000,");
        assert_eq!(
            bits(&event_of(&line)),
            [
                (14, "CmpltTO", Severity::NonFatal),
                (26, "bit26", Severity::NonFatal)
            ]
        );
        let line = CORRECTABLE.replace("Bad TLP,", ",");
        assert!(event_of(&line).errors.is_empty());
        let lost = parse_line("CPU:1 [LOST 27 EVENTS]").unwrap().unwrap();
        assert_eq!(lost, TraceRecord::Lost { cpu: 1, lost: 27 });
        let event = to_event(&lost, 0, 99);
        assert_eq!(
            (event.kind, event.lost, event.timestamp_ns),
            (EventKind::Overflow, Some(27), 99)
        );
    }

    #[test]
    fn other_lines_are_not_ours() {
        assert_eq!(parse_line("").unwrap(), None);
        assert_eq!(parse_line("   ").unwrap(), None);
        assert_eq!(parse_line("# tracer: nop").unwrap(), None);
        assert_eq!(
            parse_line("  sh-58 [000] ..... 5.1: sched_switch: prev_comm=sh").unwrap(),
            None
        );
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        for (line, what) in [
            (
                NONFATAL.replace("severity=Uncorrected, non-fatal", "severity=Odd"),
                "unknown severity",
            ),
            (
                NONFATAL.replace("Completion Timeout", "Completion Timeoutx"),
                "unknown AER error name",
            ),
            (
                NONFATAL.replace("0000:00:11.0", "slot7"),
                "device is not a PCI address",
            ),
            (
                NONFATAL.replace(", TLP Header=Not available", ""),
                "expected",
            ),
            (NONFATAL.replace("4.917689:", "4917689:"), "timestamp"),
            (NONFATAL.replace("4.917689:", "4.x:"), "timestamp"),
            (LINK_ADD_BUS.replace("width:4, ", ""), "expected"),
            (
                LINK_ADD_BUS.replace("DLLLA", "BOGUS"),
                "unknown link status flag",
            ),
            ("CPU:x [LOST 1 EVENTS]".to_string(), "LOST"),
            ("CPU:1 [LOST many EVENTS]".to_string(), "LOST"),
        ] {
            let err = parse_line(&line).unwrap_err();
            assert!(err.what.contains(what), "{line}: {err}");
            assert_eq!(err.line, line);
        }
    }
}
