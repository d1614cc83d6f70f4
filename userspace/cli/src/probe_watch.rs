//! `pcieipc probe --watch`: the topology probed again every interval, each
//! device's health from the AER errors within the window
//! (`pcieipc::probe::watch`), printed as changes or as JSON lines.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use pcieipc::probe::watch::WindowedHealth;
use pcieipc::probe::{
    Change, DeviceChange, HealthBasis, HealthModel, LinkSample, LinkState, Sample, Topology, Watch,
    AER_NOT_REPORTED,
};

use crate::probe_text::{health_text, speed_text};

pub struct WatchOptions {
    pub interval: Duration,
    pub window: Duration,
    /// Samples to take; `None`: until interrupted.
    pub count: Option<u64>,
    pub json: bool,
}

pub fn run(root: &Path, model: HealthModel, options: &WatchOptions) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        options.window >= options.interval,
        "--window ({} s) must be at least --interval ({} s): a window counts the errors seen at the samples within it",
        options.window.as_secs_f64(),
        options.interval.as_secs_f64()
    );
    let started = Instant::now();
    let mut watch = Watch::new(options.window, model);
    let stdout = std::io::stdout();
    for sample_number in 1.. {
        let topology = Topology::from_sysfs_root(root, model)
            .with_context(|| format!("probing sysfs under {}", root.display()))?;
        let elapsed = started.elapsed();
        let step = watch.push(Sample::of_topology(&topology, elapsed));
        let mut out = stdout.lock();
        if options.json {
            let line = serde_json::json!({
                "sample": sample_number,
                "elapsed_s": elapsed.as_secs_f64(),
                "window_s": options.window.as_secs_f64(),
                "span_s": step.health.span.as_secs_f64(),
                "aer_reported": topology.aer_reported(),
                "devices": step.health.devices,
                "changes": step.changes,
            });
            serde_json::to_writer(&mut out, &line).context("writing JSON")?;
            writeln!(out)?;
        } else if sample_number == 1 {
            write!(
                out,
                "{}",
                first_sample_text(
                    root,
                    options,
                    elapsed,
                    topology.aer_reported(),
                    &step.health
                )
            )?;
        } else {
            for change in &step.changes {
                writeln!(out, "{}", change_line(elapsed, change, &step.health))?;
            }
        }
        out.flush()?;
        if options.count.is_some_and(|count| sample_number >= count) {
            break;
        }
        // Samples keep to the interval's grid, whatever a probe took.
        let next = options.interval.saturating_mul(sample_number as u32);
        std::thread::sleep(next.saturating_sub(started.elapsed()));
    }
    Ok(ExitCode::SUCCESS)
}

fn first_sample_text(
    root: &Path,
    options: &WatchOptions,
    elapsed: Duration,
    aer_reported: bool,
    health: &WindowedHealth,
) -> String {
    let mut text = format!(
        "Watching PCI devices under {}: a sample every {} s, health from the AER errors of the last {} s (not lifetime totals)\n",
        root.display(),
        options.interval.as_secs_f64(),
        options.window.as_secs_f64()
    );
    if !aer_reported {
        text += &format!("{AER_NOT_REPORTED}: watching link state only\n");
    }
    for device in &health.devices {
        if device.health.is_none() && device.link.is_none() {
            continue;
        }
        let mut line = format!(
            "{:>7.1} s  {}  health {}{}",
            elapsed.as_secs_f64(),
            device.bdf,
            health_text(device.health, device.health_basis),
            if device.sub_healthy {
                " SUB-HEALTHY"
            } else {
                ""
            }
        );
        if let Some(link) = &device.link {
            line += &format!("  {}", link_text(link));
        }
        text += &line;
        text.push('\n');
    }
    text
}

fn change_line(elapsed: Duration, change: &DeviceChange, health: &WindowedHealth) -> String {
    let device = health
        .devices
        .binary_search_by_key(&change.bdf, |device| device.bdf)
        .ok()
        .map(|index| &health.devices[index]);
    let score = |score: Option<f64>| score.map_or("?".to_string(), |score| format!("{score:.4}"));
    let what = match &change.change {
        Change::Health { from, to } => {
            let device = device.expect("a device whose health changed is in the sample");
            let why = match (device.health_basis, device.window_errors) {
                (Some(HealthBasis::AerCounters), Some(errors)) => {
                    let counts: Vec<String> = [
                        (errors.correctable, "correctable"),
                        (errors.nonfatal, "non-fatal"),
                        (errors.fatal, "fatal"),
                    ]
                    .into_iter()
                    .filter(|(count, _)| *count > 0)
                    .map(|(count, name)| format!("+{count} {name}"))
                    .collect();
                    let span = health.span.as_secs_f64();
                    if counts.is_empty() {
                        format!("no AER errors in {span:.1} s")
                    } else {
                        format!("{} in {span:.1} s", counts.join(", "))
                    }
                }
                _ => "link state; AER not reported".to_string(),
            };
            format!(
                "health {} -> {} ({why}){}",
                score(*from),
                score(*to),
                if device.sub_healthy {
                    " SUB-HEALTHY"
                } else {
                    ""
                }
            )
        }
        Change::Link {
            from,
            to,
            downshift,
        } => format!(
            "link {} -> {}{}",
            link_text(from),
            link_text(to),
            if *downshift { " DOWNSHIFT" } else { "" }
        ),
        Change::CountersReset => {
            "AER counters went back (device reset or found again): counting from the new values"
                .to_string()
        }
        Change::Appeared => "appeared".to_string(),
        Change::Gone => "gone".to_string(),
    };
    format!("{:>7.1} s  {}  {what}", elapsed.as_secs_f64(), change.bdf)
}

fn link_text(link: &LinkSample) -> String {
    let width = link
        .current_width
        .map_or("x?".to_string(), |width| format!("x{width}"));
    let state = match link.state {
        LinkState::Full => "full",
        LinkState::IdleDownshiftLikely => "idle downshift likely",
        LinkState::Degraded => "DEGRADED",
        LinkState::Unknown => "state unknown",
    };
    format!("{} {width} ({state})", speed_text(link.current_speed_gts))
}
