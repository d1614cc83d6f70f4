//! What the event store keeps of an event, and how rows are told apart; no
//! I/O (the clock, sysfs and SQLite are the caller's).
//!
//! The key that makes a restarted monitor store nothing twice:
//! - module: the module keeps a backlog that every new reader of
//!   `/dev/pcieipc` gets again; its events are told apart by the boot, their
//!   CLOCK_MONOTONIC time and the module's own sequence number (which starts
//!   again at 0 when the module is reloaded, at a later time).
//! - tracefs: a tracing instance starts empty, so nothing comes twice from
//!   one monitor; two monitors tracing at once see the same record, told
//!   apart by boot, time (to the microsecond), device, kind and bits.
//! - counters: a rise is reported against the baseline that the store keeps
//!   in the same transaction as the events (`EventStore::append`), so a
//!   restarted monitor starts from where the stored events end; the key is
//!   the poll's time and the event's place in that poll.

use std::time::Duration;

use serde::Serialize;

use crate::events::{speed_gts, Event, EventSource, Link, Severity};

/// The severity names the store and the metrics use (`nonfatal`, without the
/// underscore of the events' JSON, as the kernel's `aer_dev_nonfatal` file).
pub fn severity_name(severity: Severity) -> &'static str {
    match severity {
        Severity::Correctable => "correctable",
        Severity::NonFatal => "nonfatal",
        Severity::Fatal => "fatal",
    }
}

/// What an event is stored with besides itself.
#[derive(Debug, Clone)]
pub struct StoreContext<'a> {
    /// `/proc/sys/kernel/random/boot_id`: CLOCK_MONOTONIC times are only
    /// comparable within one boot.
    pub boot_id: &'a str,
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC, in nanoseconds, when the event
    /// was stored: turns its time into wall-clock time.
    pub realtime_offset_ns: i64,
}

/// The device an event names, as sysfs described it when it was stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeviceIdentity {
    /// The class's name ("3D controller", "PCI bridge").
    pub class: Option<String>,
    pub driver: Option<String>,
}

/// One event as a row of the store.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub dedup_key: String,
    pub time_unix_ns: i64,
    pub boot_id: String,
    pub monotonic_ns: u64,
    pub source: &'static str,
    pub kind: String,
    pub bdf: String,
    pub identity: DeviceIdentity,
    /// The highest severity among its errors.
    pub severity: Option<&'static str>,
    /// The errors' short names (the kernel's), comma-separated.
    pub error_names: Option<String>,
    /// The module's AER recovery step (`error_detected`, ...).
    pub recovery_step: Option<String>,
    pub result: Option<String>,
    pub link_before: Option<String>,
    pub link_after: Option<String>,
    pub occurrences: Option<u64>,
    /// As `pcieipc monitor` prints it.
    pub line: String,
    /// As `pcieipc monitor --json` prints it.
    pub json: String,
}

impl StoredEvent {
    pub fn new(event: &Event, identity: DeviceIdentity, context: &StoreContext) -> StoredEvent {
        let severity = event
            .errors
            .iter()
            .map(|error| error.severity)
            .max_by_key(|severity| match severity {
                Severity::Correctable => 0,
                Severity::NonFatal => 1,
                Severity::Fatal => 2,
            })
            .map(severity_name);
        let error_names = (!event.errors.is_empty()).then(|| {
            event
                .errors
                .iter()
                .map(|error| error.short.as_str())
                .collect::<Vec<_>>()
                .join(",")
        });
        StoredEvent {
            dedup_key: dedup_key(event, context.boot_id),
            time_unix_ns: context
                .realtime_offset_ns
                .saturating_add(event.timestamp_ns as i64),
            boot_id: context.boot_id.to_string(),
            monotonic_ns: event.timestamp_ns,
            source: event.source.name(),
            kind: kind_name(event),
            bdf: event.bdf.clone(),
            identity,
            severity,
            error_names,
            recovery_step: event.aer_step.map(str::to_string),
            result: event.result.clone(),
            link_before: event.link_before.as_ref().map(link_text),
            link_after: event.link_after.as_ref().map(link_text),
            occurrences: event.occurrences,
            line: event.to_string(),
            // An Event always serialises: it holds strings and numbers only.
            json: serde_json::to_string(event).expect("an event serialises"),
        }
    }
}

/// The event's kind as its JSON names it (`aer`, `link_change`, ...).
pub fn kind_name(event: &Event) -> String {
    serde_json::to_value(event.kind)
        .ok()
        .and_then(|value| value.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn link_text(link: &Link) -> String {
    let mut text = format!("{} x{}", speed_gts(link.speed), link.width);
    if link.max_speed != 0 {
        text.push_str(&format!(
            " of {} x{}",
            speed_gts(link.max_speed),
            link.max_width
        ));
    }
    if link.degraded {
        text.push_str(" DEGRADED");
    }
    text
}

/// The key under which the store keeps an event once (see the module's
/// comment).
pub fn dedup_key(event: &Event, boot_id: &str) -> String {
    let time = event.timestamp_ns;
    match event.source {
        EventSource::Module => format!("module/{boot_id}/{time}/{}", event.seq),
        EventSource::Tracefs => {
            let bits: Vec<String> = event
                .errors
                .iter()
                .map(|error| format!("{}{}", severity_name(error.severity), error.bit))
                .collect();
            format!(
                "tracefs/{boot_id}/{time}/{}/{}/{}{}",
                event.bdf,
                kind_name(event),
                bits.join(","),
                event
                    .reason
                    .as_deref()
                    .map_or_else(String::new, |reason| format!("/{reason}"))
            )
        }
        EventSource::Counters => format!("counters/{boot_id}/{time}/{}", event.seq),
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--since {text}: expected a time like 2026-12-02T10:00:00Z or \"2026-12-02 10:00:00\" (UTC), or a duration ago like 90s, 30min, 2h, 7days")]
pub struct SinceError {
    pub text: String,
}

/// `--since`: a UTC time, or a duration before `now_unix_ns`; nanoseconds
/// since the epoch.
pub fn parse_since(text: &str, now_unix_ns: i64) -> Result<i64, SinceError> {
    let error = || SinceError {
        text: text.to_string(),
    };
    if let Ok(ago) = humantime::parse_duration(text) {
        return Ok(now_unix_ns.saturating_sub(i64::try_from(ago.as_nanos()).map_err(|_| error())?));
    }
    let time = humantime::parse_rfc3339_weak(text).map_err(|_| error())?;
    let since_epoch = time
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| error())?;
    i64::try_from(since_epoch.as_nanos()).map_err(|_| error())
}

/// A stored time as UTC, to the millisecond.
pub fn format_time(time_unix_ns: i64) -> String {
    let Ok(nanos) = u64::try_from(time_unix_ns) else {
        return format!("{time_unix_ns} ns");
    };
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_nanos(nanos))
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{aer_error_at, EventKind};

    const BOOT: &str = "6f1c0b0e-0d7c-4a8e-9a43-6d3c1a2b9e10";

    fn context() -> StoreContext<'static> {
        StoreContext {
            boot_id: BOOT,
            realtime_offset_ns: 1_764_000_000_000_000_000,
        }
    }

    fn tracefs_aer() -> Event {
        let mut event = Event::new(
            EventSource::Tracefs,
            EventKind::Aer,
            "0000:00:11.0".into(),
            5_196_255_000,
        );
        event.errors = vec![
            aer_error_at(14, Severity::NonFatal, false),
            aer_error_at(18, Severity::Fatal, false),
        ];
        event
    }

    #[test]
    fn a_row_keeps_what_the_monitor_printed() {
        let identity = DeviceIdentity {
            class: Some("PCI bridge".into()),
            driver: Some("pcieport".into()),
        };
        let row = StoredEvent::new(&tracefs_aer(), identity.clone(), &context());
        assert_eq!(row.time_unix_ns, 1_764_000_005_196_255_000);
        assert_eq!(row.monotonic_ns, 5_196_255_000);
        assert_eq!(row.source, "tracefs");
        assert_eq!(row.kind, "aer");
        assert_eq!(row.identity, identity);
        assert_eq!(row.severity, Some("fatal"));
        assert_eq!(row.error_names.as_deref(), Some("CmpltTO,MalfTLP"));
        assert_eq!(row.line, tracefs_aer().to_string());
        assert!(row.json.contains(r#""short":"MalfTLP","severity":"fatal""#));
        assert_eq!(
            row.dedup_key,
            format!("tracefs/{BOOT}/5196255000/0000:00:11.0/aer/nonfatal14,fatal18")
        );
    }

    #[test]
    fn keys_tell_replays_from_new_events() {
        let mut module = Event::new(
            EventSource::Module,
            EventKind::LinkRetrain,
            "0000:01:00.0".into(),
            77,
        );
        module.seq = 3;
        module.link_after = Some(Link {
            speed: 1,
            width: 1,
            max_speed: 4,
            max_width: 16,
            degraded: true,
            ..Link::default()
        });
        let row = StoredEvent::new(&module, DeviceIdentity::default(), &context());
        assert_eq!(row.dedup_key, format!("module/{BOOT}/77/3"));
        assert_eq!(
            row.link_after.as_deref(),
            Some("2.5GT/s x1 of 16GT/s x16 DEGRADED")
        );
        // The same backlog record read again has the same key; another boot's not.
        assert_eq!(dedup_key(&module, BOOT), row.dedup_key);
        assert_ne!(dedup_key(&module, "another-boot"), row.dedup_key);
        let mut reloaded = module.clone();
        reloaded.timestamp_ns = 99;
        assert_ne!(dedup_key(&reloaded, BOOT), row.dedup_key);
        let mut counters = tracefs_aer();
        counters.source = EventSource::Counters;
        counters.seq = 1;
        assert_eq!(
            dedup_key(&counters, BOOT),
            format!("counters/{BOOT}/5196255000/1")
        );
    }

    #[test]
    fn since_takes_a_time_or_a_duration_ago() {
        let now = 1_764_669_600_000_000_000; // 2025-12-02T10:00:00Z
        assert_eq!(parse_since("2h", now), Ok(now - 7_200_000_000_000));
        assert_eq!(parse_since("90s", now), Ok(now - 90_000_000_000));
        assert_eq!(
            parse_since("2025-12-02T09:00:00Z", now),
            Ok(now - 3_600_000_000_000)
        );
        assert_eq!(
            parse_since("2025-12-02 09:00:00", now),
            Ok(now - 3_600_000_000_000)
        );
        let error = parse_since("yesterday", now).unwrap_err();
        assert!(error.to_string().starts_with("--since yesterday: expected"));
        assert_eq!(format_time(now + 5_000_000), "2025-12-02T10:00:00.005Z");
    }
}
