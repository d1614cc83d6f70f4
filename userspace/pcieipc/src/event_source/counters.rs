//! The kernel's per-device AER counters (`aer_dev_correctable`,
//! `aer_dev_nonfatal`, `aer_dev_fatal` in sysfs) turned into events: two
//! readings of one file in, the event for what rose between them out. No I/O
//! (`sysfs_counters` does the polling).
//!
//! The counters name errors by the kernel's short names (drivers/pci/pcie/
//! aer.c: "RxErr", "CmpltTO"...; bits without a name as
//! "dev_cor_errs_bit[N]"); names this table does not know are left out of the
//! decoded bits but still count in `occurrences` (the TOTAL_ERR_* line).

use crate::events::{
    aer_error_at, Event, EventKind, EventSource, Severity, CORRECTABLE, UNCORRECTABLE,
};
use crate::probe::attributes::AerCounterFile;

/// The three files and the severity of the errors each counts.
pub const FILES: [(&str, Severity); 3] = [
    ("aer_dev_correctable", Severity::Correctable),
    ("aer_dev_nonfatal", Severity::NonFatal),
    ("aer_dev_fatal", Severity::Fatal),
];

/// Uncorrectable names aer.c has beyond the spec table in `events`.
const MORE_UNCORRECTABLE: [(u8, &str); 6] = [
    (26, "PoisonTLPBlocked"),
    (27, "DMWrReqBlocked"),
    (28, "IDECheck"),
    (29, "MisIDETLP"),
    (30, "PCRC_CHECK"),
    (31, "TLPXlatBlocked"),
];

/// The names the kernel's counter file of `severity` lists, in bit order
/// (the spec's table, and aer.c's further uncorrectable names).
pub fn counter_names(severity: Severity) -> Vec<&'static str> {
    if severity == Severity::Correctable {
        CORRECTABLE.iter().map(|b| b.short).collect()
    } else {
        UNCORRECTABLE
            .iter()
            .map(|b| b.short)
            .chain(MORE_UNCORRECTABLE.iter().map(|(_, short)| *short))
            .collect()
    }
}

/// The status bit a counter name stands for.
pub fn counter_bit(name: &str, severity: Severity) -> Option<u8> {
    if let Some(position) = name
        .split_once("_bit[")
        .and_then(|(_, rest)| rest.strip_suffix(']'))
        .and_then(|n| n.parse::<u8>().ok())
    {
        return (position < 32).then_some(position);
    }
    if severity == Severity::Correctable {
        CORRECTABLE.iter().find(|b| b.short == name).map(|b| b.bit)
    } else {
        UNCORRECTABLE
            .iter()
            .map(|b| (b.bit, b.short))
            .chain(MORE_UNCORRECTABLE)
            .find(|(_, short)| *short == name)
            .map(|(bit, _)| bit)
    }
}

/// The event for what rose between two readings of one device's counter
/// file, or `None` when nothing did. A total that went down (the device was
/// removed and added again) starts a new baseline: no event.
pub fn delta_event(
    device: &str,
    severity: Severity,
    before: &AerCounterFile,
    after: &AerCounterFile,
    timestamp_ns: u64,
) -> Option<Event> {
    if after.total <= before.total {
        return None;
    }
    let count_before = |name: &str| {
        before
            .nonzero_counts
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, count)| *count)
    };
    let mut errors: Vec<_> = after
        .nonzero_counts
        .iter()
        .filter(|(name, count)| *count > count_before(name))
        .filter_map(|(name, _)| counter_bit(name, severity))
        .map(|bit| aer_error_at(bit, severity, false))
        .collect();
    errors.sort_by_key(|e| e.bit);
    errors.dedup_by_key(|e| e.bit);
    let mut event = Event::new(
        EventSource::Counters,
        EventKind::Aer,
        device.to_string(),
        timestamp_ns,
    );
    event.errors = errors;
    event.occurrences = Some(after.total - before.total);
    Some(event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::attributes::parse_aer_counters;

    // The file format of drivers/pci/pcie/aer.c (aer_stats_dev_attr) on 7.3,
    // as read from the testbed's root port after one Completion Timeout and,
    // later, a Malformed TLP (reported as non-fatal here).
    const NONFATAL_BEFORE: &str =
        "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 1\nCmpltAbrt 0\n\
UnxCmplt 0\nRxOF 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\nACSViol 0\nUncorrIntErr 0\nBlockedTLP 0\n\
AtomicOpBlocked 0\nTLPBlockedErr 0\nPoisonTLPBlocked 0\nDMWrReqBlocked 0\nIDECheck 0\n\
MisIDETLP 0\nPCRC_CHECK 0\nTLPXlatBlocked 0\nTOTAL_ERR_NONFATAL 1\n";

    #[test]
    fn names_map_to_spec_positions() {
        assert_eq!(counter_bit("CmpltTO", Severity::NonFatal), Some(14));
        assert_eq!(counter_bit("MalfTLP", Severity::Fatal), Some(18));
        assert_eq!(counter_bit("UnsupReq", Severity::NonFatal), Some(20));
        assert_eq!(counter_bit("TLPXlatBlocked", Severity::Fatal), Some(31));
        assert_eq!(counter_bit("BadTLP", Severity::Correctable), Some(6));
        assert_eq!(counter_bit("RxErr", Severity::Correctable), Some(0));
        assert_eq!(
            counter_bit("dev_cor_errs_bit[9]", Severity::Correctable),
            Some(9)
        );
        assert_eq!(
            counter_bit("dev_cor_errs_bit[40]", Severity::Correctable),
            None
        );
        // A correctable name is not an uncorrectable one.
        assert_eq!(counter_bit("BadTLP", Severity::Fatal), None);
        assert_eq!(counter_bit("NoSuchError", Severity::NonFatal), None);
        // Every listed name maps back to a bit.
        for severity in [Severity::Correctable, Severity::NonFatal] {
            for name in counter_names(severity) {
                assert!(counter_bit(name, severity).is_some(), "{name}");
            }
        }
        assert_eq!(counter_names(Severity::Fatal).len(), 23);
        assert_eq!(counter_names(Severity::Correctable)[1], "BadTLP");
    }

    #[test]
    fn a_rise_becomes_one_event_with_the_bits_that_rose() {
        let before = parse_aer_counters(NONFATAL_BEFORE).unwrap();
        let after_text = NONFATAL_BEFORE
            .replace("CmpltTO 1", "CmpltTO 2")
            .replace("MalfTLP 0", "MalfTLP 2")
            .replace("TOTAL_ERR_NONFATAL 1", "TOTAL_ERR_NONFATAL 4");
        let after = parse_aer_counters(&after_text).unwrap();
        let event =
            delta_event("0000:00:10.0", Severity::NonFatal, &before, &after, 5_000).unwrap();
        assert_eq!(event.source, EventSource::Counters);
        assert_eq!(event.kind, EventKind::Aer);
        assert_eq!(event.bdf, "0000:00:10.0");
        assert_eq!(event.timestamp_ns, 5_000);
        assert_eq!(event.occurrences, Some(3));
        let bits: Vec<(u8, &str, Severity)> = event
            .errors
            .iter()
            .map(|e| (e.bit, e.short.as_str(), e.severity))
            .collect();
        assert_eq!(
            bits,
            [
                (14, "CmpltTO", Severity::NonFatal),
                (18, "MalfTLP", Severity::NonFatal)
            ]
        );
        assert!(event
            .to_string()
            .contains("AER reported x3 [14] CmpltTO (non-fatal)"));
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["source"], "counters");
        assert_eq!(json["occurrences"], 3);
        assert_eq!(json["errors"][1]["short"], "MalfTLP");
    }

    #[test]
    fn no_rise_and_a_reset_give_nothing() {
        let before = parse_aer_counters(NONFATAL_BEFORE).unwrap();
        assert_eq!(
            delta_event("0000:00:10.0", Severity::NonFatal, &before, &before, 1),
            None
        );
        let reset = parse_aer_counters("CmpltTO 0\nTOTAL_ERR_NONFATAL 0\n").unwrap();
        assert_eq!(
            delta_event("0000:00:10.0", Severity::NonFatal, &before, &reset, 1),
            None
        );
    }

    #[test]
    fn unknown_names_still_count() {
        let before = parse_aer_counters("TOTAL_ERR_COR 0\n").unwrap();
        let after = parse_aer_counters("FutureErr 2\nTOTAL_ERR_COR 2\n").unwrap();
        let event = delta_event("0000:3b:00.0", Severity::Correctable, &before, &after, 9).unwrap();
        assert!(event.errors.is_empty());
        assert_eq!(event.occurrences, Some(2));
    }
}
