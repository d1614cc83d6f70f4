//! `pcieipc probe --html`: the report as one self-contained page. The PCIe
//! tree as a graph with every link coloured by health and marked when
//! degraded or idle-downshifted, the planned ring and NCCL's bus-id-order
//! ring over it (each switchable), the GPU pairs as a matrix, the doctor's
//! findings with their evidence, a hover card per device and, given the
//! lines of `pcieipc monitor --json`, the AER and link events on a time strip.
//!
//! The SVG and tables are rendered here, in Rust, rather than by a script
//! from the embedded JSON report: everything the page shows is in its markup,
//! so the unit tests below check it without a browser and the page reads the
//! same with scripts off. The inline script only switches the rings, shows
//! the hover cards and highlights the device a finding or event names.
//! Nothing is loaded from elsewhere: styles and script are inline, and the
//! page's Content-Security-Policy forbids any other source.

#[cfg(test)]
mod fixtures;
mod layout;
mod timeline;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde::Serialize;

pub use timeline::{parse_monitor_lines, MonitorEvent};

use self::layout::{layout_tree, Point, TreeLayout, MARGIN, NODE_HEIGHT, NODE_WIDTH};
use pcieipc::plan::RingMethod;
use pcieipc::probe::report::{
    DeviceReport, GpuPairReport, LinkReport, ProbeReport, RingPlanReport, AER_NOT_REPORTED,
};
use pcieipc::probe::{Bdf, DeviceKind, LinkSpeed, LinkState, Severity};

const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// The page for `report`; `source` says what was probed (the sysfs root),
/// `events` go on the time strip (none: the strip says how to get them).
pub fn render_html(report: &ProbeReport, source: &str, events: &[MonitorEvent]) -> String {
    let gpu_names: HashMap<Bdf, String> = report
        .gpus
        .iter()
        .map(|gpu| (gpu.bdf, format!("GPU{}", gpu.index)))
        .collect();
    let mut events_per_device: HashMap<&str, usize> = HashMap::new();
    for event in events {
        *events_per_device.entry(event.bdf.as_str()).or_default() += 1;
    }
    let page = Page {
        report,
        gpu_names,
        events_per_device,
        layout: layout_tree(report),
    };
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\n\
         <title>pcieipc probe: {}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n",
        escape(source)
    );
    page.header(&mut out, source);
    page.tree_section(&mut out);
    out.push_str("<div class=\"columns\">\n");
    page.pairs_section(&mut out);
    page.findings_section(&mut out);
    out.push_str("</div>\n");
    page.events_section(&mut out, events);
    page.cards(&mut out);
    let _ = write!(out, "<script>\n{SCRIPT}</script>\n</body>\n</html>\n");
    out
}

struct Page<'a> {
    report: &'a ProbeReport,
    gpu_names: HashMap<Bdf, String>,
    events_per_device: HashMap<&'a str, usize>,
    layout: TreeLayout,
}

impl Page<'_> {
    fn header(&self, out: &mut String, source: &str) {
        let report = self.report;
        let count = |severity: Severity| {
            report
                .findings
                .iter()
                .filter(|finding| finding.severity == severity)
                .count()
        };
        let _ = writeln!(
            out,
            "<header>\n<h1>pcieipc probe</h1>\n<p class=\"summary\">PCI topology under <code>{}</code>: \
             {} devices, {} GPUs, {} findings ({} errors, {} warnings).</p>",
            escape(source),
            report.devices.len(),
            report.gpus.len(),
            report.findings.len(),
            count(Severity::Error),
            count(Severity::Warning),
        );
        if !report.aer_reported {
            let _ = writeln!(
                out,
                "<p class=\"note\">{}: health is the link state's.</p>",
                escape(AER_NOT_REPORTED)
            );
        }
        let _ = writeln!(
            out,
            "<p class=\"note\">NVLink: {}</p>\n</header>",
            escape(&report.nvlink.summary)
        );
    }

    fn tree_section(&self, out: &mut String) {
        let threshold = self.report.health_model.sub_healthy_below;
        let _ = writeln!(
            out,
            "<section id=\"topology\">\n<h2>PCIe tree</h2>\n<div class=\"controls\">"
        );
        let rings = self.rings();
        match &rings {
            Some(rings) => {
                for (name, ring) in rings {
                    let _ = writeln!(
                        out,
                        "<label class=\"toggle ring-{name}\"><input type=\"checkbox\" id=\"toggle-ring-{name}\" \
                         data-ring=\"{name}\" checked><span class=\"swatch\"></span>{}</label>",
                        escape(&self.ring_text(ring))
                    );
                }
            }
            None => out.push_str("<p class=\"note\">No ring: fewer than two GPUs.</p>\n"),
        }
        let _ = writeln!(
            out,
            "</div>\n<div class=\"legend\">links by health: \
             <span class=\"key\" style=\"background:{}\"></span>1.0 \
             <span class=\"key\" style=\"background:{}\"></span>{threshold} (sub-healthy below) \
             <span class=\"key\" style=\"background:{}\"></span>{:.2} or less \
             <span class=\"key\" style=\"background:{UNKNOWN_COLOUR}\"></span>unknown; \
             <span class=\"key-line degraded\"></span>degraded \
             <span class=\"key-line idle\"></span>idle downshift \
             <span class=\"key-line internal\"></span>inside a switch or host bridge; \
             line width: lanes. Hover a device for its card.</div>",
            health_colour(Some(1.0), threshold),
            health_colour(Some(threshold), threshold),
            health_colour(Some(2.0 * threshold - 1.0), threshold),
            2.0 * threshold - 1.0,
        );
        let ring_depth = self.ring_depth();
        let width = self.layout.width;
        let height = self.layout.height + ring_depth;
        let _ = writeln!(
            out,
            "<div class=\"scroll\"><svg id=\"tree\" width=\"{width:.0}\" height=\"{height:.0}\" \
             viewBox=\"0 0 {width:.0} {height:.0}\" role=\"img\" aria-label=\"PCIe tree\">\n\
             <defs>\
             <marker id=\"arrow-best\" class=\"arrow ring-best\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" \
             markerUnits=\"userSpaceOnUse\" markerWidth=\"11\" markerHeight=\"11\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\"/></marker>\
             <marker id=\"arrow-nccl\" class=\"arrow ring-nccl\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" \
             markerUnits=\"userSpaceOnUse\" markerWidth=\"11\" markerHeight=\"11\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\"/></marker>\
             </defs>"
        );
        self.switch_outlines(out);
        out.push_str("<g class=\"edges\">\n");
        for (index, device) in self.report.devices.iter().enumerate() {
            self.edge(out, index, device);
        }
        out.push_str("</g>\n<g class=\"nodes\">\n");
        for (index, bridge) in self.report.host_bridges.iter().enumerate() {
            let Point { x, y } = self.layout.host_bridges[index];
            let numa = bridge
                .numa_node
                .map_or("NUMA ?".to_string(), |node| format!("NUMA {node}"));
            let _ = writeln!(
                out,
                "<g class=\"host-bridge\" data-name=\"{name}\" transform=\"translate({x:.1},{y:.1})\">\
                 <rect x=\"{:.1}\" y=\"{:.1}\" width=\"{NODE_WIDTH}\" height=\"{NODE_HEIGHT}\" rx=\"5\"/>\
                 <text class=\"name\" y=\"-4\">{name}</text><text class=\"bdf\" y=\"11\">{numa}</text>\
                 <title>host bridge {name}, {numa}, CPUs {}</title></g>",
                -NODE_WIDTH / 2.0,
                -NODE_HEIGHT / 2.0,
                escape(bridge.local_cpulist.as_deref().unwrap_or("?")),
                name = escape(&bridge.name),
            );
        }
        for (index, device) in self.report.devices.iter().enumerate() {
            self.node(out, index, device);
        }
        out.push_str("</g>\n");
        for (name, ring) in rings.iter().flatten() {
            self.ring_paths(out, name, ring);
        }
        out.push_str("</svg></div>\n</section>\n");
    }

    /// The planned ring and NCCL's, by the names the page gives them; none
    /// with fewer than two GPUs.
    fn rings(&self) -> Option<[(&'static str, &RingPlanReport); 2]> {
        Some([
            ("best", self.report.ring.best.as_ref()?),
            ("nccl", self.report.ring.nccl_default.as_ref()?),
        ])
    }

    /// One line per ring: its order, bottleneck and cost.
    fn ring_text(&self, ring: &RingPlanReport) -> String {
        let name = match ring.method {
            RingMethod::Exact => "planned ring (exact)",
            RingMethod::Heuristic => "planned ring (heuristic)",
            RingMethod::BusIdOrder => "NCCL default (bus-id order)",
        };
        let mut order: Vec<String> = ring.order.iter().map(|gpu| format!("GPU{gpu}")).collect();
        order.push(format!("GPU{}", ring.order[0]));
        format!(
            "{name}: {}, bottleneck {:.2} GB/s, cost {:.1} µs",
            order.join(" → "),
            ring.bottleneck_gbps,
            ring.total_cost_us
        )
    }

    /// A rounded box behind the ports of each switch: P2P that turns
    /// around inside it counts as one bridge (PIX).
    fn switch_outlines(&self, out: &mut String) {
        out.push_str("<g class=\"switches\">\n");
        for (index, device) in self.report.devices.iter().enumerate() {
            if device.kind != DeviceKind::SwitchUpstreamPort {
                continue;
            }
            let ports: Vec<Point> = std::iter::once(index)
                .chain(self.children_of(device.bdf))
                .map(|port| self.layout.devices[port])
                .collect();
            let left = ports.iter().map(|p| p.x).fold(f64::MAX, f64::min) - NODE_WIDTH / 2.0 - 6.0;
            let right = ports.iter().map(|p| p.x).fold(f64::MIN, f64::max) + NODE_WIDTH / 2.0 + 6.0;
            let top = ports.iter().map(|p| p.y).fold(f64::MAX, f64::min) - NODE_HEIGHT / 2.0 - 6.0;
            let bottom =
                ports.iter().map(|p| p.y).fold(f64::MIN, f64::max) + NODE_HEIGHT / 2.0 + 6.0;
            let _ = writeln!(
                out,
                "<rect class=\"switch\" x=\"{left:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" rx=\"10\">\
                 <title>PCIe switch of upstream port {}</title></rect>",
                right - left,
                bottom - top,
                device.bdf
            );
        }
        out.push_str("</g>\n");
    }

    fn children_of(&self, bdf: Bdf) -> impl Iterator<Item = usize> + '_ {
        self.report
            .devices
            .iter()
            .enumerate()
            .filter(move |(_, device)| device.parent == Some(bdf))
            .map(|(index, _)| index)
    }

    /// Centre of the box above a device: its parent's, else its host bridge's.
    fn above(&self, device: &DeviceReport) -> Option<Point> {
        match device.parent {
            Some(parent) => self
                .report
                .devices
                .iter()
                .position(|candidate| candidate.bdf == parent)
                .map(|index| self.layout.devices[index]),
            None => self
                .report
                .host_bridges
                .iter()
                .position(|bridge| bridge.name == device.host_bridge)
                .map(|index| self.layout.host_bridges[index]),
        }
    }

    /// The line from a device up to the box above it: its link, coloured by
    /// the link's health and marked when degraded or idle-downshifted, or a
    /// thin grey line inside a switch or on a host bridge's root bus.
    fn edge(&self, out: &mut String, index: usize, device: &DeviceReport) {
        let Some(from) = self.above(device) else {
            return;
        };
        let to = self.layout.devices[index];
        let (x1, y1, x2, y2) = (
            from.x,
            from.y + NODE_HEIGHT / 2.0,
            to.x,
            to.y - NODE_HEIGHT / 2.0,
        );
        let Some(link) = &device.link else {
            let _ = writeln!(
                out,
                "<line class=\"internal\" x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\"/>"
            );
            return;
        };
        let threshold = self.report.health_model.sub_healthy_below;
        let state = json_name(&link.state);
        let state_class = match link.state {
            LinkState::Degraded => " degraded",
            LinkState::IdleDownshiftLikely => " idle-downshift",
            LinkState::Full | LinkState::Unknown => "",
        };
        let lanes = f64::from(link.current_width.unwrap_or(1).max(1));
        let stroke_width = 1.5 + 0.6 * lanes.log2();
        let upstream = link
            .upstream_port
            .map_or("(port hidden)".to_string(), |port| port.to_string());
        let _ = writeln!(
            out,
            "<g class=\"link{state_class}\" data-bdf=\"{bdf}\" data-state=\"{state}\" data-health=\"{health}\">\
             <line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"{colour}\" stroke-width=\"{stroke_width:.1}\"/>\
             <title>link {upstream} → {bdf}: {now} of {max}, {state}, health {health}</title>",
            bdf = device.bdf,
            health = score_text(link.health),
            colour = health_colour(link.health, threshold),
            now = link_now(link),
            max = link_max(link),
        );
        // Right of the line near the device below, where sibling links are
        // furthest apart; a degraded or idle link's mark, in the same place,
        // says what it runs at instead.
        let (label_x, label_y) = (x1 + 0.7 * (x2 - x1) + 5.0, y1 + 0.7 * (y2 - y1));
        let mark = match link.state {
            LinkState::Degraded => Some(("degraded-mark", format!("DEGRADED {}", shortfall(link)))),
            LinkState::IdleDownshiftLikely => Some((
                "idle-mark",
                format!("idle {}", speed_text(link.current_speed_gts)),
            )),
            LinkState::Full | LinkState::Unknown => None,
        };
        match mark {
            Some((class, text)) => {
                let mark_width = MARK_CHAR_WIDTH * text.chars().count() as f64 + 8.0;
                let _ = writeln!(
                    out,
                    "<g class=\"{class}\" transform=\"translate({label_x:.1},{label_y:.1})\">\
                     <rect y=\"-9\" width=\"{mark_width:.1}\" height=\"16\" rx=\"8\"/>\
                     <text x=\"4\" y=\"3\">{}</text></g>",
                    escape(&text)
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "<text class=\"link-label\" x=\"{label_x:.1}\" y=\"{:.1}\">{}</text>",
                    label_y + 3.0,
                    link_now(link)
                );
            }
        }
        out.push_str("</g>\n");
    }

    fn node(&self, out: &mut String, index: usize, device: &DeviceReport) {
        let Point { x, y } = self.layout.devices[index];
        let threshold = self.report.health_model.sub_healthy_below;
        let mut classes = vec!["device", kind_class(device.kind)];
        if device.is_gpu {
            classes.push("gpu");
        }
        if device.sub_healthy {
            classes.push("sub-healthy");
        }
        let acs_redirect = device
            .acs
            .as_ref()
            .is_some_and(|acs| acs.redirects_peer_to_peer);
        let _ = write!(
            out,
            "<g class=\"{}\" data-bdf=\"{bdf}\" data-card=\"card-{id}\" tabindex=\"0\" \
             transform=\"translate({x:.1},{y:.1})\">\
             <rect x=\"{:.1}\" y=\"{:.1}\" width=\"{NODE_WIDTH}\" height=\"{NODE_HEIGHT}\" rx=\"5\" stroke=\"{}\"/>\
             <text class=\"name\" y=\"-4\">{}</text><text class=\"bdf\" y=\"11\">{bdf}</text>",
            classes.join(" "),
            -NODE_WIDTH / 2.0,
            -NODE_HEIGHT / 2.0,
            health_colour(device.health, threshold),
            escape(&self.short_name(device)),
            bdf = device.bdf,
            id = element_id(device.bdf),
        );
        if acs_redirect {
            let _ = write!(
                out,
                "<text class=\"badge acs\" x=\"{:.1}\" y=\"{:.1}\">ACS</text>",
                NODE_WIDTH / 2.0 - 3.0,
                -NODE_HEIGHT / 2.0 - 3.0
            );
        }
        if let Some(count) = self.events_per_device.get(device.bdf.to_string().as_str()) {
            let _ = write!(
                out,
                "<g class=\"event-count\" transform=\"translate({:.1},{:.1})\"><circle r=\"9\"/>\
                 <text y=\"4\">{count}</text></g>",
                -NODE_WIDTH / 2.0,
                -NODE_HEIGHT / 2.0
            );
        }
        out.push_str("</g>\n");
    }

    /// The box's first line: GPU number, port role or vendor.
    fn short_name(&self, device: &DeviceReport) -> String {
        if let Some(name) = self.gpu_names.get(&device.bdf) {
            return name.clone();
        }
        match device.kind {
            DeviceKind::RootPort => "root port".to_string(),
            DeviceKind::SwitchUpstreamPort => "switch up".to_string(),
            DeviceKind::SwitchDownstreamPort => "switch down".to_string(),
            DeviceKind::Bridge => "bridge".to_string(),
            DeviceKind::Endpoint => device
                .vendor_name
                .map(str::to_string)
                .or_else(|| device.vendor_id.clone())
                .unwrap_or_else(|| "device".to_string()),
        }
    }

    /// How far the ring curves reach below the lowest box.
    fn ring_depth(&self) -> f64 {
        if self.rings().is_none() {
            return 0.0;
        }
        let xs: Vec<f64> = self
            .report
            .gpus
            .iter()
            .filter_map(|gpu| self.gpu_point(gpu.bdf))
            .map(|point| point.x)
            .collect();
        let span = xs.iter().copied().fold(f64::MIN, f64::max)
            - xs.iter().copied().fold(f64::MAX, f64::min);
        let (base, per_distance) = ring_bend("best");
        // A cubic curve with both control points `bend` down reaches 3/4 of it.
        0.75 * (base + per_distance * span) + 2.0 * MARGIN
    }

    fn gpu_point(&self, bdf: Bdf) -> Option<Point> {
        self.report
            .devices
            .iter()
            .position(|device| device.bdf == bdf)
            .map(|index| self.layout.devices[index])
    }

    /// The ring as curves below the GPUs, one per hop with an arrow at the
    /// receiver; the hops at the ring's bottleneck are drawn thicker and
    /// labelled with their bandwidth.
    fn ring_paths(&self, out: &mut String, name: &str, ring: &RingPlanReport) {
        let (base, per_distance) = ring_bend(name);
        // The two rings leave and reach a GPU at different points, so that a
        // hop both take stays visible twice.
        let offset = if name == "best" { -10.0 } else { 10.0 };
        let _ = writeln!(out, "<g class=\"ring ring-{name}\" data-ring=\"{name}\">");
        let members = ring.order_bdf.len();
        for hop in 0..members {
            let (from_gpu, to_gpu) = (ring.order[hop], ring.order[(hop + 1) % members]);
            let (Some(from), Some(to)) = (
                self.gpu_point(ring.order_bdf[hop]),
                self.gpu_point(ring.order_bdf[(hop + 1) % members]),
            ) else {
                continue;
            };
            let bandwidth = self
                .pair(from_gpu, to_gpu)
                .map_or(f64::NAN, |pair| pair.model_bandwidth_gbps);
            let bottleneck = (bandwidth - ring.bottleneck_gbps).abs() < 1e-9;
            let (x1, x2) = (from.x + offset, to.x + offset);
            let (y1, y2) = (from.y + NODE_HEIGHT / 2.0, to.y + NODE_HEIGHT / 2.0);
            let bend = base + per_distance * (x2 - x1).abs();
            let _ = writeln!(
                out,
                "<path class=\"ring-edge{}\" d=\"M{x1:.1},{y1:.1} C{x1:.1},{:.1} {x2:.1},{:.1} {x2:.1},{y2:.1}\" \
                 marker-end=\"url(#arrow-{name})\"><title>GPU{from_gpu} → GPU{to_gpu}: {bandwidth:.2} GB/s in the cost model{}</title></path>",
                if bottleneck { " bottleneck" } else { "" },
                y1 + bend,
                y2 + bend,
                if bottleneck { " (the ring's bottleneck)" } else { "" },
            );
            if bottleneck {
                let _ = writeln!(
                    out,
                    "<text class=\"ring-label\" x=\"{:.1}\" y=\"{:.1}\">{bandwidth:.1} GB/s</text>",
                    (x1 + x2) / 2.0,
                    (y1 + y2) / 2.0 + 0.75 * bend + 12.0
                );
            }
        }
        out.push_str("</g>\n");
    }

    fn pair(&self, a: usize, b: usize) -> Option<&GpuPairReport> {
        let (a, b) = (a.min(b), a.max(b));
        self.report
            .gpu_pairs
            .iter()
            .find(|pair| pair.a == a && pair.b == b)
    }

    /// GPU pairs as nvidia-smi's matrix: class, hops and bottleneck, NVLink
    /// where present; the hops of each ring outlined in its colour.
    fn pairs_section(&self, out: &mut String) {
        let gpus = &self.report.gpus;
        let _ = writeln!(out, "<section id=\"pairs\">\n<h2>GPU pairs</h2>");
        if gpus.len() < 2 {
            let _ = writeln!(
                out,
                "<p class=\"note\">{} GPUs: no pairs.</p>\n</section>",
                gpus.len()
            );
            return;
        }
        let mut ring_hops: BTreeMap<(usize, usize), Vec<&str>> = BTreeMap::new();
        for (name, ring) in self.rings().iter().flatten() {
            for hop in 0..ring.order.len() {
                let (a, b) = (ring.order[hop], ring.order[(hop + 1) % ring.order.len()]);
                ring_hops
                    .entry((a.min(b), a.max(b)))
                    .or_default()
                    .push(name);
            }
        }
        out.push_str(
            "<p class=\"note\">Path class as <code>nvidia-smi topo -m</code> prints it (NV# = bonded NVLinks), \
             PCIe hops, bottleneck GB/s per direction; * P2P sent through the root complex by ACS. \
             Outlined: hops of the planned (blue) and NCCL default (orange) rings.</p>\n\
             <table id=\"gpu-pairs\">\n<thead><tr><th></th>",
        );
        for gpu in gpus {
            let _ = write!(
                out,
                "<th>GPU{}<br><small>{}</small></th>",
                gpu.index, gpu.bdf
            );
        }
        out.push_str("</tr></thead>\n<tbody>\n");
        for a in gpus {
            let _ = write!(out, "<tr><th>GPU{}</th>", a.index);
            for b in gpus {
                let Some(pair) = self.pair(a.index, b.index).filter(|_| a.index != b.index) else {
                    out.push_str("<td class=\"self\">X</td>");
                    continue;
                };
                let mut classes = vec![format!("pair class-{}", pair.class.to_lowercase())];
                if pair.nvlink.is_some() {
                    classes.push("nvlink".to_string());
                }
                for ring in ring_hops.get(&(pair.a, pair.b)).into_iter().flatten() {
                    classes.push(format!("in-ring-{ring}"));
                }
                let bottleneck = pair.bottleneck.as_ref().map_or("?".to_string(), |found| {
                    format!("{:.1}", found.bandwidth_gbps)
                });
                let detail = match &pair.nvlink {
                    Some(nvlink) => format!(
                        "NVLink {} GB/s",
                        nvlink
                            .bandwidth_gbps
                            .map_or("?".to_string(), |gbps| format!("{gbps:.0}"))
                    ),
                    None => format!("{}h · {bottleneck}", pair.hops),
                };
                let _ = write!(
                    out,
                    "<td class=\"{}\" data-a=\"{}\" data-b=\"{}\" title=\"GPU{} – GPU{}: {}, PCIe {} ({} hops, bottleneck {bottleneck} GB/s), \
                     P2P route {}, health {}, model {:.2} GB/s, {:.1} µs per chunk\"><b>{}{}</b><br>{detail}</td>",
                    classes.join(" "),
                    pair.a,
                    pair.b,
                    pair.a,
                    pair.b,
                    escape(&pair.class),
                    pair.pcie_class.as_str(),
                    pair.hops,
                    json_name(&pair.p2p_route).replace('_', " "),
                    score_text(pair.health),
                    pair.model_bandwidth_gbps,
                    pair.model_cost_us,
                    escape(&pair.class),
                    if pair.acs_redirecting_ports.is_empty() { "" } else { "*" },
                );
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</tbody>\n</table>\n</section>\n");
    }

    fn findings_section(&self, out: &mut String) {
        let findings = &self.report.findings;
        let _ = writeln!(
            out,
            "<section id=\"findings\">\n<h2>Findings ({})</h2>\n<ol class=\"findings\">",
            findings.len()
        );
        for finding in findings {
            let device = finding.device.map(|bdf| bdf.to_string());
            let _ = writeln!(
                out,
                "<li class=\"finding {severity}\" data-kind=\"{kind}\"{device_attribute}>\
                 <span class=\"severity\">{severity}</span> <b>{kind}</b> <code>{device}</code>\
                 <div class=\"evidence\"><span>evidence</span> {}</div>\
                 <div class=\"action\"><span>do</span> {}</div></li>",
                escape(&finding.evidence),
                escape(&finding.action),
                severity = finding.severity,
                kind = json_name(&finding.kind),
                device_attribute = device
                    .as_ref()
                    .map_or(String::new(), |bdf| format!(" data-device=\"{bdf}\"")),
                device = device.as_deref().unwrap_or("-"),
            );
        }
        out.push_str("</ol>\n</section>\n");
    }

    /// Events on a time strip: one lane per device, time from the first
    /// event; AER errors as dots by their worst severity, link events as
    /// diamonds (red when the link came out degraded).
    fn events_section(&self, out: &mut String, events: &[MonitorEvent]) {
        let _ = writeln!(
            out,
            "<section id=\"events\">\n<h2>Events ({})</h2>",
            events.len()
        );
        if events.is_empty() {
            out.push_str(
                "<p class=\"note\">No events given: <code>pcieipc probe --html FILE --events EVENTS</code> \
                 puts the JSON lines of <code>pcieipc monitor --json &gt; EVENTS</code> here.</p>\n</section>\n",
            );
            return;
        }
        let mut lanes: Vec<&str> = events.iter().map(|event| event.bdf.as_str()).collect();
        lanes.sort_unstable();
        lanes.dedup();
        let start = events
            .iter()
            .map(|event| event.timestamp_ns)
            .min()
            .unwrap_or(0);
        let end = events
            .iter()
            .map(|event| event.timestamp_ns)
            .max()
            .unwrap_or(0);
        let span_s = (end - start) as f64 / 1e9;
        const LABEL_WIDTH: f64 = 170.0;
        const PLOT_WIDTH: f64 = 900.0;
        const LANE_HEIGHT: f64 = 24.0;
        let height = MARGIN + lanes.len() as f64 * LANE_HEIGHT + 30.0;
        let x_at = |seconds: f64| {
            LABEL_WIDTH
                + if span_s > 0.0 {
                    seconds / span_s * PLOT_WIDTH
                } else {
                    0.0
                }
        };
        let seconds_of = |event: &MonitorEvent| (event.timestamp_ns - start) as f64 / 1e9;
        let _ = writeln!(
            out,
            "<p class=\"note\">From the first event ({:.6} s on CLOCK_MONOTONIC) to the last, {span_s:.3} s. \
             Dots: AER (<span class=\"sev fatal\">fatal</span>, <span class=\"sev non_fatal\">non-fatal</span>, \
             <span class=\"sev correctable\">correctable</span>); diamonds: link events.</p>\n\
             <div class=\"scroll\"><svg id=\"timeline\" width=\"{w:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {w:.0} {height:.0}\">",
            start as f64 / 1e9,
            w = LABEL_WIDTH + PLOT_WIDTH + MARGIN,
        );
        let axis_y = MARGIN + lanes.len() as f64 * LANE_HEIGHT;
        let step = tick_step(span_s);
        let decimals = (-step.log10().floor()).max(0.0) as usize;
        let mut tick = 0.0;
        while tick <= span_s + 1e-9 {
            let x = x_at(tick);
            let _ = writeln!(
                out,
                "<line class=\"tick\" x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{axis_y:.1}\"/>\
                 <text class=\"tick-label\" x=\"{x:.1}\" y=\"{:.1}\">{tick:.decimals$} s</text>",
                MARGIN / 2.0,
                axis_y + 16.0
            );
            if span_s <= 0.0 {
                break;
            }
            tick = ((tick + step) / step).round() * step;
        }
        for (lane, bdf) in lanes.iter().enumerate() {
            let y = MARGIN + (lane as f64 + 0.5) * LANE_HEIGHT;
            let label = bdf
                .parse::<Bdf>()
                .ok()
                .and_then(|parsed| self.gpu_names.get(&parsed))
                .map_or(bdf.to_string(), |name| format!("{bdf} {name}"));
            let _ = writeln!(
                out,
                "<g class=\"lane\" data-device=\"{}\"><line x1=\"{LABEL_WIDTH}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\">{}</text></g>",
                escape(bdf),
                LABEL_WIDTH + PLOT_WIDTH,
                LABEL_WIDTH - 8.0,
                y + 4.0,
                escape(&label)
            );
        }
        for event in events {
            let lane = lanes.iter().position(|bdf| *bdf == event.bdf).unwrap_or(0);
            let (x, y) = (
                x_at(seconds_of(event)),
                MARGIN + (lane as f64 + 0.5) * LANE_HEIGHT,
            );
            let severity = event.worst_severity().unwrap_or("none");
            let shape = match event.kind.as_str() {
                "aer" => "<circle r=\"6\"/>",
                _ => {
                    "<rect x=\"-5\" y=\"-5\" width=\"10\" height=\"10\" transform=\"rotate(45)\"/>"
                }
            };
            let _ = writeln!(
                out,
                "<g class=\"event {kind} severity-{severity}{degraded}\" data-kind=\"{kind}\" data-bdf=\"{bdf}\" \
                 transform=\"translate({x:.1},{y:.1})\">{shape}<title>+{:.3} s {bdf}: {}</title></g>",
                seconds_of(event),
                escape(&event.describe()),
                kind = escape(&event.kind),
                bdf = escape(&event.bdf),
                degraded = if event.degrades_link() { " degraded" } else { "" },
            );
        }
        out.push_str("</svg></div>\n</section>\n");
    }

    /// A card per device, shown by the script while the pointer is on its box.
    fn cards(&self, out: &mut String) {
        out.push_str("<div id=\"cards\">\n");
        for device in &self.report.devices {
            self.card(out, device);
        }
        out.push_str("</div>\n");
    }

    fn card(&self, out: &mut String, device: &DeviceReport) {
        let report = self.report;
        let mut rows: Vec<(&str, String)> = Vec::new();
        let identity = [
            device.class_name.map(str::to_string),
            device
                .vendor_name
                .map(str::to_string)
                .or_else(|| device.vendor_id.clone()),
            device.device_id.clone(),
        ];
        rows.push((
            "device",
            identity.into_iter().flatten().collect::<Vec<_>>().join(" "),
        ));
        rows.push(("role", json_name(&device.kind).replace('_', " ")));
        rows.push((
            "driver",
            device.driver.clone().unwrap_or_else(|| "none".to_string()),
        ));
        rows.push((
            "link now",
            device
                .link
                .as_ref()
                .map_or("no link of its own".to_string(), |link| {
                    format!(
                        "{} ({})",
                        link_now(link),
                        json_name(&link.state).replace('_', " ")
                    )
                }),
        ));
        if let Some(link) = &device.link {
            rows.push(("link max", link_max(link)));
            rows.push((
                "bandwidth",
                link.effective_bandwidth_gbps
                    .map_or("?".to_string(), |gbps| {
                        format!("{gbps:.2} GB/s per direction")
                    }),
            ));
            rows.push((
                "port above",
                link.upstream_port
                    .map_or("hidden (a VM's root bus)".to_string(), |port| {
                        port.to_string()
                    }),
            ));
        }
        rows.push(("AER", aer_text(device, report.aer_reported)));
        rows.push((
            "health",
            match (device.health, device.health_basis) {
                (Some(score), basis) => format!(
                    "{score:.4} from {}{}",
                    basis.map_or("?".to_string(), |basis| json_name(&basis).replace('_', " ")),
                    if device.sub_healthy {
                        ", SUB-HEALTHY"
                    } else {
                        ""
                    }
                ),
                (None, _) => "unknown (no AER counters, link state unknown)".to_string(),
            },
        ));
        rows.push((
            "IOMMU group",
            device
                .iommu_group
                .map_or("none".to_string(), |group| group.to_string()),
        ));
        rows.push(("BARs", bars_text(device)));
        rows.push((
            "NUMA",
            format!(
                "{}, CPUs {}",
                device
                    .numa_node
                    .map_or("?".to_string(), |node| node.to_string()),
                device.local_cpulist.as_deref().unwrap_or("?")
            ),
        ));
        if let Some(acs) = &device.acs {
            rows.push((
                "ACS",
                format!("@{:#x}: {}", acs.offset, acs.control_decoded),
            ));
        }
        if let Some(count) = self.events_per_device.get(device.bdf.to_string().as_str()) {
            rows.push(("events", format!("{count} on the time strip")));
        }
        let title = match self.gpu_names.get(&device.bdf) {
            Some(name) => format!("{} {name}", device.bdf),
            None => device.bdf.to_string(),
        };
        let _ = write!(
            out,
            "<div class=\"card\" id=\"card-{}\" data-bdf=\"{}\"><h3>{}</h3><table>",
            element_id(device.bdf),
            device.bdf,
            escape(&title)
        );
        for (name, value) in rows {
            let _ = write!(out, "<tr><th>{name}</th><td>{}</td></tr>", escape(&value));
        }
        out.push_str("</table></div>\n");
    }
}

/// Width of a character of the links' marks (10 px monospace).
const MARK_CHAR_WIDTH: f64 = 6.1;

/// Colour of links and boxes without a health score.
const UNKNOWN_COLOUR: &str = "#9e9e9e";

/// Green at 1, yellow at the sub-healthy threshold, red as far below it as
/// 1 is above; grey when unknown.
fn health_colour(score: Option<f64>, sub_healthy_below: f64) -> String {
    let Some(score) = score else {
        return UNKNOWN_COLOUR.to_string();
    };
    let span = (1.0 - sub_healthy_below).max(f64::EPSILON);
    let position = ((score - sub_healthy_below) / span).clamp(-1.0, 1.0);
    format!("hsl({:.0},75%,38%)", 60.0 + 60.0 * position)
}

/// How far below the GPUs a ring's curves reach: base + per unit of
/// horizontal distance. The planned ring bends deeper than NCCL's, so the
/// two stay apart where they join the same GPUs.
fn ring_bend(name: &str) -> (f64, f64) {
    if name == "best" {
        (40.0, 0.2)
    } else {
        (24.0, 0.12)
    }
}

/// A round step for time-axis ticks: 1, 2 or 5 × 10^k seconds, at most ten ticks.
fn tick_step(span_s: f64) -> f64 {
    let rough = (span_s / 10.0).max(1e-6);
    let magnitude = 10f64.powf(rough.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|factor| factor * magnitude)
        .find(|step| *step >= rough)
        .unwrap_or(10.0 * magnitude)
}

fn kind_class(kind: DeviceKind) -> &'static str {
    match kind {
        DeviceKind::RootPort => "root-port",
        DeviceKind::SwitchUpstreamPort => "switch-upstream",
        DeviceKind::SwitchDownstreamPort => "switch-downstream",
        DeviceKind::Bridge => "bridge",
        DeviceKind::Endpoint => "endpoint",
    }
}

fn speed_text(speed: Option<LinkSpeed>) -> String {
    speed.map_or("? GT/s".to_string(), |speed| {
        format!("{} GT/s", speed.gigatransfers_per_second())
    })
}

fn width_text(width: Option<u8>) -> String {
    width.map_or("x?".to_string(), |width| format!("x{width}"))
}

fn link_now(link: &LinkReport) -> String {
    format!(
        "{} {}",
        speed_text(link.current_speed_gts),
        width_text(link.current_width)
    )
}

fn link_max(link: &LinkReport) -> String {
    format!(
        "{} {}",
        speed_text(link.max_speed_gts),
        width_text(link.max_width)
    )
}

/// What a degraded link lacks, now/capable: "x8/x16", "8/16 GT/s", or both.
fn shortfall(link: &LinkReport) -> String {
    let mut parts = Vec::new();
    if link.current_width < link.max_width {
        parts.push(format!(
            "{}/{}",
            width_text(link.current_width),
            width_text(link.max_width)
        ));
    }
    if link.current_speed_gts < link.max_speed_gts {
        let number = |speed: Option<LinkSpeed>| {
            speed.map_or("?".to_string(), |speed| {
                speed.gigatransfers_per_second().to_string()
            })
        };
        parts.push(format!(
            "{}/{} GT/s",
            number(link.current_speed_gts),
            number(link.max_speed_gts)
        ));
    }
    parts.join(" ")
}

fn score_text(score: Option<f64>) -> String {
    score.map_or("?".to_string(), |score| format!("{score:.4}"))
}

fn aer_text(device: &DeviceReport, aer_reported: bool) -> String {
    let Some(aer) = &device.aer else {
        return if aer_reported {
            "AER not reported for this device".to_string()
        } else {
            "AER not reported by this kernel/VM".to_string()
        };
    };
    let total = |value: Option<u64>| value.map_or("?".to_string(), |count| count.to_string());
    let mut text = format!(
        "correctable {}, non-fatal {}, fatal {}",
        total(aer.correctable_total),
        total(aer.nonfatal_total),
        total(aer.fatal_total)
    );
    if !aer.nonzero_counts.is_empty() {
        let counts: Vec<String> = aer
            .nonzero_counts
            .iter()
            .map(|(name, count)| format!("{name} {count}"))
            .collect();
        text += &format!(" ({})", counts.join(", "));
    }
    if let Some(below) = aer.rootport_total_correctable {
        text += &format!(
            "; reported from below: correctable {below}, non-fatal {}, fatal {}",
            total(aer.rootport_total_nonfatal),
            total(aer.rootport_total_fatal)
        );
    }
    text
}

fn bars_text(device: &DeviceReport) -> String {
    let Some(bars) = &device.bars else {
        return "unknown".to_string();
    };
    if bars.is_empty() {
        return "none".to_string();
    }
    let described: Vec<String> = bars
        .iter()
        .map(|bar| {
            let mut text = format!("BAR{} {}", bar.index, size_text(bar.size_bytes));
            if !bar.is_memory {
                text += " I/O";
            }
            if bar.is_64bit {
                text += " 64-bit";
            }
            if bar.prefetchable {
                text += " prefetchable";
            }
            let resizable = device
                .resizable_bars
                .iter()
                .flatten()
                .find(|resizable| resizable.bar_index == bar.index);
            if let Some(max) = resizable.and_then(|resizable| resizable.max_supported_bytes()) {
                text += &format!(" (resizable to {})", size_text(max));
            }
            text
        })
        .collect();
    described.join("; ")
}

fn size_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024 && value.is_multiple_of(1024) && unit + 1 < UNITS.len() {
        value /= 1024;
        unit += 1;
    }
    format!("{value} {}", UNITS[unit])
}

/// An id for markup: "0000:05:00.0" -> "0000-05-00-0".
fn element_id(bdf: Bdf) -> String {
    bdf.to_string().replace([':', '.'], "-")
}

/// The name serde gives a value: a finding kind, a link state, a route.
fn json_name<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|value| value.as_str().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

/// Text for HTML content and attribute values.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            other => escaped.push(other),
        }
    }
    escaped
}

#[cfg(test)]
pub(super) mod tests {
    use std::path::Path;

    use super::*;
    use pcieipc::plan::CostModel;
    use pcieipc::probe::{HealthModel, NvlinkSource, Nvlinks, NvmlFixture, Topology};

    use super::fixtures::{dgx8_report, fixture, report_of};

    fn count(html: &str, needle: &str) -> usize {
        html.matches(needle).count()
    }

    /// The `data-bdf` values of the elements that start with `opening`.
    fn bdfs_of(html: &str, opening: &str) -> Vec<String> {
        html.match_indices(opening)
            .map(|(at, _)| {
                let rest = &html[at..];
                let start = rest.find("data-bdf=\"").unwrap() + "data-bdf=\"".len();
                rest[start..start + 12].to_string()
            })
            .collect()
    }

    #[test]
    fn every_device_has_a_box_and_a_card() {
        let report = dgx8_report();
        let html = render_html(&report, "tests/fixtures/sysfs/dgx8", &[]);
        let expected: Vec<String> = report
            .devices
            .iter()
            .map(|device| device.bdf.to_string())
            .collect();
        assert_eq!(expected.len(), 38);
        assert_eq!(bdfs_of(&html, "<g class=\"device "), expected);
        assert_eq!(bdfs_of(&html, "<div class=\"card\""), expected);
        assert_eq!(count(&html, "<g class=\"host-bridge\""), 2);
        // GPU6's card: its counters, health and BARs.
        let card = &html[html.find("id=\"card-0000-8a-00-0\"").unwrap()..];
        let card = &card[..card.find("</div>").unwrap()];
        for expected in [
            "<h3>0000:8a:00.0 GPU6</h3>",
            "<th>link now</th><td>16 GT/s x16 (full)</td>",
            "<th>link max</th><td>16 GT/s x16</td>",
            "<th>AER</th><td>correctable 90000, non-fatal 3, fatal 0 (RxErr 80000, BadTLP 9000, BadDLLP 1000, CmpltTO 3)</td>",
            "<th>health</th><td>0.9097 from aer counters, SUB-HEALTHY</td>",
            "<th>IOMMU group</th><td>32</td>",
            "<th>BARs</th><td>BAR0 16 MiB; BAR1 64 GiB 64-bit prefetchable (resizable to 64 GiB); BAR3 32 MiB 64-bit prefetchable</td>",
        ] {
            assert!(card.contains(expected), "{expected:?} not in {card}");
        }
    }

    #[test]
    fn the_page_is_self_contained() {
        let html = render_html(&dgx8_report(), "dgx8", &[]);
        for external in ["http://", "https://", "src=", "<link", "@import", "//cdn"] {
            assert!(!html.contains(external), "{external:?} in the page");
        }
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert_eq!(count(&html, "<style>"), 1);
        assert_eq!(count(&html, "<script>"), 1);
        assert!(html.contains("default-src 'none'"));
    }

    #[test]
    fn links_are_coloured_by_health_and_the_degraded_one_is_marked() {
        let report = dgx8_report();
        let html = render_html(&report, "dgx8", &[]);
        assert_eq!(
            bdfs_of(&html, "<g class=\"link degraded\""),
            ["0000:08:00.0"]
        );
        assert_eq!(count(&html, "<g class=\"degraded-mark\""), 1);
        assert!(html.contains("<text x=\"4\" y=\"3\">DEGRADED x8/x16</text>"));
        assert_eq!(
            bdfs_of(&html, "<g class=\"link idle-downshift\""),
            ["0000:8b:00.0"]
        );
        assert!(html.contains("<text x=\"4\" y=\"3\">idle 2.5 GT/s</text>"));
        let with_link = report
            .devices
            .iter()
            .filter(|device| device.link.is_some())
            .count();
        assert_eq!(count(&html, "<g class=\"link"), with_link);
        assert_eq!(count(&html, "<text class=\"link-label\""), with_link - 2);
        // GPU6's link at 0.9097, just under the 0.92 threshold: amber; full health green.
        assert!(html.contains(
            "data-bdf=\"0000:8a:00.0\" data-state=\"full\" data-health=\"0.9097\"><line"
        ));
        assert_eq!(health_colour(Some(0.909727), 0.92), "hsl(52,75%,38%)");
        assert_eq!(health_colour(Some(1.0), 0.92), "hsl(120,75%,38%)");
        assert_eq!(health_colour(Some(0.5), 0.92), "hsl(0,75%,38%)");
        assert_eq!(health_colour(None, 0.92), UNKNOWN_COLOUR);
    }

    #[test]
    fn both_rings_are_drawn_hop_by_hop() {
        let report = dgx8_report();
        let html = render_html(&report, "dgx8", &[]);
        for name in ["best", "nccl"] {
            let start = html
                .find(&format!("<g class=\"ring ring-{name}\""))
                .unwrap();
            let group = &html[start..start + html[start..].find("</g>").unwrap()];
            assert_eq!(count(group, "<path class=\"ring-edge"), 8, "{name}");
            assert!(html.contains(&format!(
                "id=\"toggle-ring-{name}\" data-ring=\"{name}\" checked"
            )));
        }
        // NCCL's bottleneck: the hop that enters GPU2/GPU3 behind the x8 uplink.
        let nccl = &html[html.find("<g class=\"ring ring-nccl\"").unwrap()..];
        assert!(nccl.contains(
            "<title>GPU3 → GPU4: 6.30 GB/s in the cost model (the ring's bottleneck)</title>"
        ));
        assert!(html.contains(
            "planned ring (exact): GPU0 → GPU5 → GPU7 → GPU6 → GPU4 → GPU1 → GPU3 → GPU2 → GPU0, bottleneck 12.60 GB/s"
        ));
    }

    #[test]
    fn the_pair_matrix_names_class_hops_and_bottleneck() {
        let html = render_html(&dgx8_report(), "dgx8", &[]);
        let table = &html[html.find("<table id=\"gpu-pairs\">").unwrap()..];
        let table = &table[..table.find("</table>").unwrap()];
        assert_eq!(count(table, "<td class=\"pair"), 8 * 7);
        assert_eq!(count(table, "<td class=\"self\">X</td>"), 8);
        assert!(table.contains("data-a=\"2\" data-b=\"3\""));
        assert!(
            table.contains("<b>PIX*</b><br>2h · 31.5</td>"),
            "ACS-redirected GPU4-GPU5"
        );
        assert!(table.contains("<b>PXB</b><br>4h · 15.8</td>"));
    }

    #[test]
    fn nvlink_pairs_show_their_links() {
        let root = fixture("h200-2gpu-vm");
        let answers = NvmlFixture::new(&root.join("nvml.json")).answers().unwrap();
        let topology = Topology::from_sysfs_root(&root, HealthModel::default())
            .unwrap()
            .with_nvlinks(Nvlinks::from_answers(&answers));
        let report = ProbeReport::new(&topology, &CostModel::default());
        let html = render_html(&report, "h200-2gpu-vm", &[]);
        assert_eq!(count(&html, "<b>NV18</b><br>NVLink 450 GB/s</td>"), 2);
        assert!(html.contains("AER: not reported by this kernel/VM"));
        assert!(html.contains("<th>AER</th><td>AER not reported by this kernel/VM</td>"));
    }

    #[test]
    fn without_gpus_there_is_no_ring_to_switch() {
        let report = report_of("this-machine-virtio");
        let html = render_html(&report, "/", &[]);
        assert!(report.gpus.is_empty());
        assert!(html.contains("No ring: fewer than two GPUs."));
        assert!(!html.contains("<g class=\"ring "));
        assert!(!html.contains("type=\"checkbox\""));
        assert_eq!(count(&html, "<g class=\"device "), report.devices.len());
    }

    #[test]
    fn text_from_sysfs_is_escaped() {
        let mut report = dgx8_report();
        report.devices[0].driver = Some("<script>alert('x')</script>".to_string());
        let html = render_html(&report, "a&b", &[]);
        assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"));
        assert_eq!(count(&html, "<script>"), 1);
        assert!(html.contains("<code>a&amp;b</code>"));
    }

    #[test]
    fn events_go_on_the_time_strip() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures/events/dgx8-monitor.jsonl"),
        )
        .unwrap();
        let events = parse_monitor_lines(&text).unwrap();
        let html = render_html(&dgx8_report(), "dgx8", &events);
        assert_eq!(count(&html, "<g class=\"event "), events.len());
        assert_eq!(
            bdfs_of(
                &html,
                "<g class=\"event link_change severity-none degraded\""
            ),
            ["0000:08:00.0"]
        );
        assert!(html.contains(&format!("<h2>Events ({})</h2>", events.len())));
        // The device boxes count their events.
        let gpu6 = events
            .iter()
            .filter(|event| event.bdf == "0000:8a:00.0")
            .count();
        assert!(html.contains(&format!("<th>events</th><td>{gpu6} on the time strip</td>")));
        assert!(gpu6 > 0);
    }

    #[test]
    fn tick_steps_are_round() {
        assert_eq!(tick_step(10.0), 1.0);
        assert_eq!(tick_step(0.9), 0.1);
        assert_eq!(tick_step(33.0), 5.0);
        assert_eq!(tick_step(150.0), 20.0);
    }

    #[test]
    fn sizes_use_the_largest_exact_unit() {
        assert_eq!(size_text(256 << 20), "256 MiB");
        assert_eq!(size_text(64 << 30), "64 GiB");
        assert_eq!(size_text(4096 + 1), "4097 B");
    }
}
