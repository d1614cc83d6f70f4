//! `pcieipc probe`: the PCI tree with link speeds, widths and health, GPU
//! paths, the P2P readiness findings and the planned ring.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::html::{parse_monitor_lines, render_html, MonitorEvent};
use crate::probe_text::{health_text, speed_text};
use anyhow::Context;
use pcieipc::plan::CostModel;
use pcieipc::probe::nvlink::{GpuNvlinkState, NvlinkRemote};
use pcieipc::probe::report::{DeviceReport, GpuPairReport, GpuReport, LinkReport, RingPlanReport};
use pcieipc::probe::{
    Bdf, HealthModel, LinkState, NvlinkSource, NvlinkStatus, Nvlinks, NvmlFixture, NvmlLibrary,
    ProbeReport, Severity, Topology, AER_NOT_REPORTED,
};

#[derive(clap::Args)]
pub struct Args {
    /// Root of the sysfs tree: the probe reads DIR/sys (a copied tree works too).
    #[arg(long, value_name = "DIR", default_value = "/")]
    sysfs_root: PathBuf,
    /// Print the report as JSON (schema: docs/schemas/probe-v2.schema.json).
    #[arg(long)]
    json: bool,
    /// Read NVLink state from NVML answers recorded in FILE (by --capture-nvml)
    /// instead of asking the driver: with --sysfs-root, another machine's.
    #[arg(long, value_name = "FILE", conflicts_with = "capture_nvml")]
    nvml_fixture: Option<PathBuf>,
    /// Ask the driver's NVML and also write its answers to FILE, to replay them
    /// with --nvml-fixture (next to a sysfs copy made by capture.sh).
    #[arg(long, value_name = "FILE")]
    capture_nvml: Option<PathBuf>,
    /// Exit with status 1 when a finding is at or above SEVERITY (info, warning, error).
    #[arg(long, value_name = "SEVERITY", default_value = "error")]
    fail_on: Severity,
    /// Health model: correctable AER errors that take a device's score to 0.
    #[arg(long, value_name = "COUNT", default_value_t = HealthModel::default().correctable_scale)]
    correctable_scale: f64,
    /// Health model: uncorrectable (non-fatal + fatal) AER errors that take the score to 0.
    #[arg(long, value_name = "COUNT", default_value_t = HealthModel::default().uncorrectable_scale)]
    uncorrectable_scale: f64,
    /// Health model: scores below this are sub-healthy.
    #[arg(long, value_name = "SCORE", default_value_t = HealthModel::default().sub_healthy_below)]
    sub_healthy_below: f64,
    /// Also write the report as one self-contained HTML page to FILE: the PCIe
    /// tree with links coloured by health, both rings, the GPU pairs, the
    /// findings and a card per device.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// With --html: put the events in FILE (the JSON lines of `pcieipc monitor
    /// --json`) on the page's time strip.
    #[arg(long, value_name = "FILE", requires = "html")]
    events: Option<PathBuf>,
    /// Instead of one report, sample the AER counters and links every
    /// --interval and print each change: a device's health from the errors of
    /// the last --window (not lifetime totals), link speed and width changes.
    #[arg(long, conflicts_with_all = ["nvml_fixture", "capture_nvml", "fail_on", "html"])]
    watch: bool,
    /// With --watch: seconds between samples.
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_seconds, requires = "watch")]
    interval: Duration,
    /// With --watch: seconds of errors a device's health is scored from.
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = parse_seconds, requires = "watch")]
    window: Duration,
    /// With --watch: stop after this many samples (default: until interrupted).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), requires = "watch")]
    count: Option<u64>,
}

/// A positive number of seconds (fractions allowed).
fn parse_seconds(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
        .filter(|duration| !duration.is_zero())
        .ok_or_else(|| format!("{text:?} is not a positive number of seconds"))
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.correctable_scale > 0.0 && args.uncorrectable_scale > 0.0,
        "--correctable-scale and --uncorrectable-scale must be positive"
    );
    let health_model = HealthModel {
        correctable_scale: args.correctable_scale,
        uncorrectable_scale: args.uncorrectable_scale,
        sub_healthy_below: args.sub_healthy_below,
    };
    if args.watch {
        let watch = crate::probe_watch::WatchOptions {
            interval: args.interval,
            window: args.window,
            count: args.count,
            json: args.json,
        };
        return crate::probe_watch::run(&args.sysfs_root, health_model, &watch);
    }
    let topology = Topology::from_sysfs_root(&args.sysfs_root, health_model)
        .with_context(|| format!("probing sysfs under {}", args.sysfs_root.display()))?
        .with_nvlinks(nvlinks(&args)?);
    let report = ProbeReport::new(&topology, &CostModel::default());
    if let Some(path) = &args.html {
        let page = render_html(
            &report,
            &args.sysfs_root.display().to_string(),
            &monitor_events(args.events.as_deref())?,
        );
        std::fs::write(path, page)
            .with_context(|| format!("writing the HTML report to {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report, &args.sysfs_root));
    }
    let failed = report
        .worst_severity()
        .is_some_and(|worst| worst >= args.fail_on);
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The events of a `pcieipc monitor --json` file; none without one.
fn monitor_events(path: Option<&std::path::Path>) -> anyhow::Result<Vec<MonitorEvent>> {
    let Some(path) = path else {
        return Ok(Vec::new());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading events from {}", path.display()))?;
    parse_monitor_lines(&text).with_context(|| format!("events in {}", path.display()))
}

/// NVLink from recorded answers, or from the driver when probing this
/// machine; the driver's absence is a line of the report, not an error.
fn nvlinks(args: &Args) -> anyhow::Result<Nvlinks> {
    if let Some(path) = &args.nvml_fixture {
        return Ok(Nvlinks::from_answers(&NvmlFixture::new(path).answers()?));
    }
    let this_machine = args.sysfs_root == std::path::Path::new("/");
    if !this_machine && args.capture_nvml.is_none() {
        return Ok(Nvlinks::without(NvlinkStatus::NotRead));
    }
    let live = NvmlLibrary::open().and_then(|nvml| nvml.answers());
    match (live, &args.capture_nvml) {
        (Ok(answers), Some(path)) => {
            std::fs::write(path, serde_json::to_string_pretty(&answers)? + "\n")
                .with_context(|| format!("writing NVML answers to {}", path.display()))?;
            Ok(Nvlinks::from_answers(&answers))
        }
        (Ok(answers), None) => Ok(Nvlinks::from_answers(&answers)),
        (Err(error), Some(_)) => Err(error).context("capturing NVML answers"),
        (Err(error), None) => Ok(Nvlinks::without(NvlinkStatus::Unavailable(format!(
            "{:#}",
            anyhow::Error::from(error)
        )))),
    }
}

fn render(report: &ProbeReport, root: &std::path::Path) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "PCI topology under {}", root.display());
    let gpu_names: BTreeMap<Bdf, String> = report
        .gpus
        .iter()
        .map(|gpu| (gpu.bdf, format!("GPU{}", gpu.index)))
        .collect();
    let mut children: BTreeMap<Option<Bdf>, Vec<&DeviceReport>> = BTreeMap::new();
    for device in &report.devices {
        children.entry(device.parent).or_default().push(device);
    }
    for bridge in &report.host_bridges {
        let numa = bridge
            .numa_node
            .map_or("?".to_string(), |node| node.to_string());
        let cpus = bridge.local_cpulist.as_deref().unwrap_or("?");
        let _ = writeln!(out, "{}  NUMA {numa}  CPUs {cpus}", bridge.name);
        let on_root_bus: Vec<&DeviceReport> = report
            .devices
            .iter()
            .filter(|device| device.parent.is_none() && device.host_bridge == bridge.name)
            .collect();
        render_children(&mut out, &on_root_bus, &children, &gpu_names, "");
    }
    if !report.aer_reported {
        let _ = writeln!(out, "{AER_NOT_REPORTED}: health is the link state's");
    }

    if report.gpus.is_empty() {
        let _ = writeln!(out, "\nGPUs: none");
    } else {
        let _ = writeln!(out, "\nGPUs (bus-id order):");
        for gpu in &report.gpus {
            let bottleneck =
                gpu.bottleneck_to_root
                    .as_ref()
                    .map_or("unknown".to_string(), |found| {
                        format!(
                            "{:.2} GB/s (link above {})",
                            found.bandwidth_gbps, found.link_above
                        )
                    });
            let _ = writeln!(
                out,
                "  GPU{:<2} {}  NUMA {}  bottleneck to root {}  health {}{}",
                gpu.index,
                gpu.bdf,
                gpu.numa_node
                    .map_or("?".to_string(), |node| node.to_string()),
                bottleneck,
                health_text(gpu.health, gpu.health_basis),
                if gpu.sub_healthy { " SUB-HEALTHY" } else { "" },
            );
            if let Some(line) = nvlink_line(gpu, &gpu_names) {
                let _ = writeln!(out, "        {line}");
            }
        }
        let driver = report
            .nvlink
            .driver_version
            .as_ref()
            .map_or(String::new(), |version| format!(" (driver {version})"));
        let _ = writeln!(out, "  NVLink: {}{driver}", report.nvlink.summary);
        render_pairs(&mut out, report);
    }

    let _ = writeln!(out, "\nFindings ({}):", report.findings.len());
    for finding in &report.findings {
        let device = finding
            .device
            .map_or("-".to_string(), |bdf| bdf.to_string());
        let severity = finding.severity.to_string().to_uppercase();
        let kind = serde_json::to_value(finding.kind).ok();
        let kind = kind
            .as_ref()
            .and_then(|value| value.as_str())
            .unwrap_or("?");
        let _ = writeln!(out, "  {severity:<7} {kind:<22} {device}");
        let _ = writeln!(out, "          evidence: {}", finding.evidence);
        let _ = writeln!(out, "          do: {}", finding.action);
    }

    let _ = writeln!(
        out,
        "\nRing (cost: microseconds to pass one {} KiB chunk around):",
        report.ring.cost_model.chunk_bytes >> 10
    );
    match (&report.ring.best, &report.ring.nccl_default) {
        (Some(best), Some(default)) => {
            let method = if best.method == pcieipc::plan::RingMethod::Exact {
                "optimal"
            } else {
                "heuristic"
            };
            let _ = writeln!(out, "  {method:<13} {}", ring_line(best));
            let _ = writeln!(out, "  NCCL default  {}", ring_line(default));
        }
        _ => {
            let _ = writeln!(out, "  none (fewer than two GPUs)");
        }
    }
    out
}

fn render_children(
    out: &mut String,
    devices: &[&DeviceReport],
    children: &BTreeMap<Option<Bdf>, Vec<&DeviceReport>>,
    gpu_names: &BTreeMap<Bdf, String>,
    prefix: &str,
) {
    for (position, device) in devices.iter().enumerate() {
        let last = position + 1 == devices.len();
        let _ = writeln!(
            out,
            "{prefix}{}{}",
            if last { "\\-" } else { "+-" },
            device_line(device, gpu_names)
        );
        if let Some(below) = children.get(&Some(device.bdf)) {
            let deeper = format!("{prefix}{}", if last { "  " } else { "| " });
            render_children(out, below, children, gpu_names, &deeper);
        }
    }
}

fn device_line(device: &DeviceReport, gpu_names: &BTreeMap<Bdf, String>) -> String {
    let mut line = format!(
        "[{}] {}: {} {}",
        device.bdf,
        device.class_name.unwrap_or("Device"),
        device
            .vendor_name
            .map(str::to_string)
            .or_else(|| device.vendor_id.clone())
            .unwrap_or_else(|| "?".to_string()),
        device.device_id.as_deref().unwrap_or("?"),
    );
    if let Some(name) = gpu_names.get(&device.bdf) {
        let _ = write!(line, " <{name}>");
    }
    if let Some(link) = &device.link {
        let _ = write!(line, "  {}", link_text(link));
    }
    if device.health.is_some() {
        let _ = write!(
            line,
            "  health {}{}",
            health_text(device.health, device.health_basis),
            if device.sub_healthy {
                " SUB-HEALTHY"
            } else {
                ""
            }
        );
    }
    if device
        .acs
        .as_ref()
        .is_some_and(|acs| acs.redirects_peer_to_peer)
    {
        line += "  ACS-REDIRECT";
    }
    line
}

/// A GPU's active NVLinks grouped by what they reach.
fn nvlink_line(gpu: &GpuReport, gpu_names: &BTreeMap<Bdf, String>) -> Option<String> {
    let GpuNvlinkState::Read { active } = gpu.nvlink.as_ref()? else {
        return None;
    };
    if active.is_empty() {
        return Some("NVLink: no active links".to_string());
    }
    let mut reached: BTreeMap<String, usize> = BTreeMap::new();
    for link in active {
        let name = match link.remote {
            NvlinkRemote::Gpu(bdf) => gpu_names
                .get(&bdf)
                .map_or(format!("GPU {bdf}"), |name| format!("{name} ({bdf})")),
            NvlinkRemote::Switch(_) => "NVSwitch".to_string(),
            NvlinkRemote::Npu(bdf) => format!("NPU {bdf}"),
            NvlinkRemote::Unknown(bdf) => {
                bdf.map_or("unknown".to_string(), |bdf| format!("unknown {bdf}"))
            }
        };
        *reached.entry(name).or_default() += 1;
    }
    let targets: Vec<String> = reached
        .iter()
        .map(|(name, count)| format!("{count} to {name}"))
        .collect();
    let first = &active[0];
    let version = serde_json::to_value(first.version)
        .ok()
        .and_then(|value| value.as_str().map(str::to_string))
        .map_or("version unknown".to_string(), |version| {
            format!("NVLink {version}")
        });
    let speed = first
        .bandwidth_gbps
        .map_or(String::new(), |gbps| format!(", {gbps:.1} GB/s each"));
    Some(format!(
        "NVLink: {} active: {} ({version}{speed})",
        active.len(),
        targets.join(", ")
    ))
}

fn link_text(link: &LinkReport) -> String {
    let width = |width: Option<u8>| width.map_or("x?".to_string(), |width| format!("x{width}"));
    let current = format!(
        "{} {}",
        speed_text(link.current_speed_gts),
        width(link.current_width)
    );
    let capable = format!(
        "{} {}",
        speed_text(link.max_speed_gts),
        width(link.max_width)
    );
    match link.state {
        LinkState::Full => current,
        LinkState::Unknown => format!("link {current} (max {capable})"),
        LinkState::Degraded => match &link.retrain {
            Some(retrain) if retrain.retrainable => {
                format!("{current} of {capable} DEGRADED (retrainable)")
            }
            Some(retrain) => format!(
                "{current} of {capable} DEGRADED (not retrainable: {}{})",
                retrain.reason,
                retrain
                    .allow
                    .as_ref()
                    .map_or(String::new(), |allow| format!("; to allow: {allow}"))
            ),
            None => format!("{current} of {capable} DEGRADED"),
        },
        LinkState::IdleDownshiftLikely => format!("{current} of {capable} (idle downshift likely)"),
    }
}

fn render_pairs(out: &mut String, report: &ProbeReport) {
    let count = report.gpus.len();
    let pairs: BTreeMap<(usize, usize), &GpuPairReport> = report
        .gpu_pairs
        .iter()
        .map(|pair| ((pair.a, pair.b), pair))
        .collect();
    let _ = writeln!(
        out,
        "\nGPU pairs: path class (NV# = # bonded NVLinks), PCIe hops, bottleneck GB/s (* = P2P via root complex by ACS)"
    );
    let _ = write!(out, "{:8}", "");
    for b in 0..count {
        let _ = write!(out, "{:>16}", format!("GPU{b}"));
    }
    let _ = writeln!(out);
    for a in 0..count {
        let _ = write!(out, "  {:6}", format!("GPU{a}"));
        for b in 0..count {
            let cell = match pairs.get(&(a.min(b), a.max(b))) {
                None => "X".to_string(),
                Some(pair) if pair.nvlink.is_some() => format!(
                    "{} {}",
                    pair.class,
                    pair.nvlink
                        .and_then(|nvlink| nvlink.bandwidth_gbps)
                        .map_or("?".to_string(), |gbps| format!("{gbps:.1}"))
                ),
                Some(pair) => format!(
                    "{}{} {}h {}",
                    pair.class,
                    if pair.acs_redirecting_ports.is_empty() {
                        ""
                    } else {
                        "*"
                    },
                    pair.hops,
                    pair.bottleneck
                        .as_ref()
                        .map_or("?".to_string(), |found| format!(
                            "{:.1}",
                            found.bandwidth_gbps
                        ))
                ),
            };
            let _ = write!(out, "{cell:>16}");
        }
        let _ = writeln!(out);
    }
}

fn ring_line(ring: &RingPlanReport) -> String {
    let mut order: Vec<String> = ring.order.iter().map(|gpu| format!("GPU{gpu}")).collect();
    order.push(format!("GPU{}", ring.order[0]));
    format!(
        "{}  bottleneck {:.2} GB/s, cost {:.1} us",
        order.join(" -> "),
        ring.bottleneck_gbps,
        ring.total_cost_us
    )
}
