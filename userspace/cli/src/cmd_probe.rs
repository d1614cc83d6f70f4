//! `pcieipc probe`: the PCI tree with link speeds, widths and health, GPU
//! paths, the P2P readiness findings and the planned ring.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use pcieipc::plan::CostModel;
use pcieipc::probe::report::{DeviceReport, GpuPairReport, LinkReport, RingPlanReport};
use pcieipc::probe::{Bdf, HealthModel, LinkState, ProbeReport, Severity, Topology};

#[derive(clap::Args)]
pub struct Args {
    /// Root of the sysfs tree: the probe reads DIR/sys (a copied tree works too).
    #[arg(long, value_name = "DIR", default_value = "/")]
    sysfs_root: PathBuf,
    /// Print the report as JSON (schema: docs/schemas/probe-v1.schema.json).
    #[arg(long)]
    json: bool,
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
    let topology = Topology::from_sysfs_root(&args.sysfs_root, health_model)
        .with_context(|| format!("probing sysfs under {}", args.sysfs_root.display()))?;
    let report = ProbeReport::new(&topology, &CostModel::default());
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
                gpu.health
                    .map_or("?".to_string(), |score| format!("{score:.4}")),
                if gpu.sub_healthy { " SUB-HEALTHY" } else { "" },
            );
        }
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
    if let Some(score) = device.health {
        let _ = write!(
            line,
            "  health {score:.4}{}",
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

fn speed_text(speed: Option<pcieipc::probe::LinkSpeed>) -> String {
    speed.map_or("?".to_string(), |speed| {
        format!("{:.1} GT/s", speed.gigatransfers_per_second())
    })
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
        LinkState::Degraded => format!("{current} of {capable} DEGRADED"),
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
        "\nGPU pairs: path class, hops, bottleneck GB/s (* = P2P via root complex by ACS)"
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
                Some(pair) => format!(
                    "{}{} {}h {}",
                    pair.class.as_str(),
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
