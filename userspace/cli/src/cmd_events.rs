//! `pcieipc events`: what `pcieipc monitor --store` kept, oldest first, or
//! counted per device and error (`--summary`, as `ras-mc-ctl --summary`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use pcieipc::{
    event_source::monotonic_now_ns,
    event_store::{
        realtime_offset_ns,
        record::{format_time, parse_since},
        EventFilter, EventStore, DEFAULT_STORE,
    },
    probe::Bdf,
};

#[derive(clap::Args)]
pub struct Args {
    /// The event store `pcieipc monitor --store` writes.
    #[arg(long, value_name = "FILE", default_value = DEFAULT_STORE)]
    store: PathBuf,
    /// Only events since this UTC time (2026-12-02T10:00:00Z) or this long
    /// ago (90s, 30min, 2h, 7days).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Only events of this device (0000:65:00.0 or 65:00.0).
    #[arg(long, value_name = "BDF")]
    device: Option<String>,
    /// One JSON object per line (per device and error with --summary).
    #[arg(long)]
    json: bool,
    /// Count AER errors per device, error and severity, and other events per
    /// device and kind.
    #[arg(long)]
    summary: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let now = realtime_offset_ns().saturating_add(monotonic_now_ns() as i64);
    let filter = EventFilter {
        since_unix_ns: args
            .since
            .as_deref()
            .map(|text| parse_since(text, now))
            .transpose()?,
        bdf: args
            .device
            .as_deref()
            .map(|text| {
                text.parse::<Bdf>()
                    .map(|bdf| bdf.to_string())
                    .with_context(|| format!("--device {text}"))
            })
            .transpose()?,
    };
    let store = EventStore::open_read_only(&args.store)?;
    let mut out = std::io::stdout().lock();
    if args.summary {
        let summary = store.summary(&filter)?;
        if args.json {
            serde_json::to_writer(&mut out, &summary)?;
            writeln!(out)?;
            return Ok(ExitCode::SUCCESS);
        }
        writeln!(
            out,
            "AER errors per device (reports; {}):",
            args.store.display()
        )?;
        if summary.errors.is_empty() {
            writeln!(out, "  none")?;
        }
        for count in &summary.errors {
            writeln!(
                out,
                "  {}  {:<28} {:<10} {:<12} {:<14} {}",
                count.bdf,
                count.class.as_deref().unwrap_or("-"),
                count.driver.as_deref().unwrap_or("-"),
                count.severity,
                count.error,
                count.reports
            )?;
        }
        writeln!(out, "Other events per device:")?;
        if summary.others.is_empty() {
            writeln!(out, "  none")?;
        }
        for count in &summary.others {
            writeln!(out, "  {}  {:<14} {}", count.bdf, count.kind, count.events)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    for row in store.events(&filter)? {
        if args.json {
            let mut event: serde_json::Value =
                serde_json::from_str(&row.json).context("a stored event's JSON")?;
            let fields = event
                .as_object_mut()
                .context("a stored event's JSON is not an object")?;
            fields.insert("time".into(), format_time(row.time_unix_ns).into());
            fields.insert("time_unix_ns".into(), row.time_unix_ns.into());
            fields.insert("boot_id".into(), row.boot_id.into());
            fields.insert("class".into(), row.class.into());
            fields.insert("driver".into(), row.driver.into());
            serde_json::to_writer(&mut out, &event)?;
            writeln!(out)?;
        } else {
            let identity = match (&row.class, &row.driver) {
                (None, None) => String::new(),
                (class, driver) => format!(
                    " ({}, {})",
                    class.as_deref().unwrap_or("-"),
                    driver.as_deref().unwrap_or("no driver")
                ),
            };
            writeln!(
                out,
                "{} {}{identity}",
                format_time(row.time_unix_ns),
                row.line
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
