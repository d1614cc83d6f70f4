//! The P2P readiness doctor: findings about links, AER health, ACS, IOMMU
//! groups and BARs, each with a severity, the device, the evidence (register
//! or attribute and its value) and what to do.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::bdf::Bdf;
use super::config_space::STANDARD_HEADER_LEN;
use super::link::{Link, LinkSpeed, LinkState};
use super::retrain::retrainability;
use super::topology::{DevicePath, Topology};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

impl FromStr for Severity {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "info" => Ok(Severity::Info),
            "warning" => Ok(Severity::Warning),
            "error" => Ok(Severity::Error),
            other => Err(format!(
                "unknown severity {other:?}: use info, warning or error"
            )),
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    NoGpus,
    DegradedLink,
    IdleDownshiftLikely,
    NarrowLink,
    SubHealthy,
    AcsRedirect,
    AcsUnknown,
    IommuGroupShared,
    SmallBar,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub kind: FindingKind,
    /// The device concerned; `None` for findings about the whole machine.
    pub device: Option<Bdf>,
    /// The register or attribute and its value.
    pub evidence: String,
    /// What to do about it.
    pub action: String,
}

/// How peer-to-peer traffic between two devices travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerRoute {
    /// Turns around inside a PCIe switch.
    Switch,
    /// Crosses a host bridge: through the root complex by topology.
    RootComplex,
    /// Would turn around in a switch, but ACS redirect sends it up to the
    /// root complex.
    AcsRedirected,
    /// Would turn around in a switch; ACS of its ports could not be read.
    AcsUnknown,
}

/// The ACS state of the switch ports where a path's P2P traffic turns around.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAcs {
    pub route: PeerRoute,
    /// Ports with P2P Request or Completion Redirect enabled.
    pub redirecting_ports: Vec<usize>,
    /// Ports whose extended config space was not readable.
    pub unknown_ports: Vec<usize>,
}

/// ACS redirect acts at the port where a request enters the switch in which
/// it would turn around: the path's ports directly below the common bridge.
pub fn peer_acs(topology: &Topology, path: &DevicePath) -> PeerAcs {
    let Some(common) = path.common_bridge else {
        return PeerAcs {
            route: PeerRoute::RootComplex,
            redirecting_ports: Vec::new(),
            unknown_ports: Vec::new(),
        };
    };
    let ingress: Vec<usize> = path
        .bridges
        .iter()
        .copied()
        .filter(|&bridge| topology.parent(bridge) == Some(common))
        .collect();
    let redirecting_ports: Vec<usize> = ingress
        .iter()
        .copied()
        .filter(|&port| {
            topology.devices[port]
                .acs
                .is_some_and(|acs| acs.redirects_peer_to_peer())
        })
        .collect();
    let unknown_ports: Vec<usize> = ingress
        .iter()
        .copied()
        .filter(|&port| {
            let device = &topology.devices[port];
            device.acs.is_none()
                && device.config_bytes_readable < super::config_space::EXTENDED_CONFIG_LEN
        })
        .collect();
    let route = if !redirecting_ports.is_empty() {
        PeerRoute::AcsRedirected
    } else if !unknown_ports.is_empty() {
        PeerRoute::AcsUnknown
    } else {
        PeerRoute::Switch
    };
    PeerAcs {
        route,
        redirecting_ports,
        unknown_ports,
    }
}

/// All findings, most severe first, then in bus-id order.
pub fn diagnose(topology: &Topology) -> Vec<Finding> {
    let mut findings = Vec::new();
    let gpus = topology.gpus();
    if gpus.is_empty() {
        findings.push(Finding {
            severity: Severity::Info,
            kind: FindingKind::NoGpus,
            device: None,
            evidence: format!(
                "{} PCI functions, none of class 0x0300, 0x0302 or 0x1200",
                topology.devices.len()
            ),
            action: "nothing to plan here: run on the GPU server, or point --sysfs-root at a \
                     copy of its /sys"
                .to_string(),
        });
    }
    let gpu_path_links: BTreeSet<usize> = gpus
        .iter()
        .flat_map(|&gpu| topology.links_to_root(gpu))
        .collect();
    for (index, link) in topology.links.iter().enumerate() {
        link_findings(
            topology,
            link,
            gpu_path_links.contains(&index),
            &mut findings,
        );
    }
    for (index, device) in topology.devices.iter().enumerate() {
        // Without AER counters a low score comes from a degraded link, which
        // has its own finding.
        if device.aer_reported() && topology.is_sub_healthy(index) {
            findings.push(sub_healthy_finding(topology, index));
        }
        if device.is_gpu {
            bar_findings(topology, index, &mut findings);
        }
    }
    iommu_findings(topology, &gpus, &mut findings);
    acs_findings(topology, &gpus, &mut findings);
    findings.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.device.cmp(&b.device)));
    findings
}

fn speed_text(speed: Option<LinkSpeed>) -> String {
    speed.map_or("unknown".to_string(), |speed| {
        format!("{:.1} GT/s", speed.gigatransfers_per_second())
    })
}

fn width_text(width: Option<u8>) -> String {
    width.map_or("x?".to_string(), |width| format!("x{width}"))
}

/// The link's values, and the raw LnkSta/LnkCap when config space was read.
fn link_evidence(topology: &Topology, link: &Link) -> String {
    let below = &topology.devices[link.downstream];
    let (ends, which) = match link.upstream {
        Some(port) => (
            format!("link {} -> {}", topology.devices[port].bdf, below.bdf),
            "lower of both ends",
        ),
        None => (
            format!("link of {}", below.bdf),
            "port above not visible: the device's own view",
        ),
    };
    let mut text = format!(
        "{ends}: current {} {}, capable {} {} ({which})",
        speed_text(link.current_speed),
        width_text(link.current_width),
        speed_text(link.max_speed),
        width_text(link.max_width),
    );
    if let Some(target) = link.target_speed {
        text += &format!(", LnkCtl2 target {}", speed_text(Some(target)));
    }
    if let Some((capability, registers)) = below
        .pci_express
        .and_then(|capability| Some((capability, capability.link?)))
    {
        text += &format!(
            "; {}: LnkSta@{:#x}={:#06x} LnkCap@{:#x}={:#010x}",
            below.bdf,
            capability.offset + 0x12,
            registers.link_status,
            capability.offset + 0x0c,
            registers.link_capabilities
        );
    }
    text
}

/// How to retrain `link` with pcieipc, or why it cannot and what allows it.
fn retrain_advice(topology: &Topology, link: &Link) -> String {
    let device = topology.devices[link.downstream].bdf;
    let verdict = retrainability(topology, link, topology.link_control.as_deref());
    match (verdict.retrainable, verdict.allow) {
        (true, _) => format!("`pcieipc link retrain {device}` ({})", verdict.reason),
        (false, Some(allow)) => format!(
            "pcieipc cannot retrain it now: {}; to allow it: {allow}",
            verdict.reason
        ),
        (false, None) => format!("pcieipc cannot retrain it: {}", verdict.reason),
    }
}

fn link_findings(topology: &Topology, link: &Link, on_gpu_path: bool, findings: &mut Vec<Finding>) {
    let device = Some(topology.devices[link.downstream].bdf);
    match link.state {
        LinkState::Degraded => findings.push(Finding {
            severity: if on_gpu_path {
                Severity::Error
            } else {
                Severity::Warning
            },
            kind: FindingKind::DegradedLink,
            device,
            evidence: link_evidence(topology, link),
            action: format!(
                "retrain it; a link that trains low again needs its card, riser or cable \
                 reseated, and one that still does has a bad lane, slot or retimer. Until then \
                 every path through it runs at the reduced bandwidth. {}",
                retrain_advice(topology, link)
            ),
        }),
        LinkState::IdleDownshiftLikely => findings.push(Finding {
            severity: Severity::Info,
            kind: FindingKind::IdleDownshiftLikely,
            device,
            evidence: link_evidence(topology, link),
            action: "GPUs lower the link speed when idle: probe again under load (e.g. during \
                     pcieipc bench); if the speed stays low, treat the link as degraded"
                .to_string(),
        }),
        LinkState::Full | LinkState::Unknown => {}
    }
    let narrow = link.current_width.is_some_and(|width| width < 16);
    if on_gpu_path && narrow && link.state != LinkState::Degraded {
        findings.push(Finding {
            severity: Severity::Warning,
            kind: FindingKind::NarrowLink,
            device,
            evidence: link_evidence(topology, link),
            action: "a GPU path runs through a link narrower than x16: move the device to an \
                     x16 slot, or expect peer bandwidth limited to this link"
                .to_string(),
        });
    }
}

fn sub_healthy_finding(topology: &Topology, index: usize) -> Finding {
    let device = &topology.devices[index];
    let aer = &device.aer;
    let total = |file: &Option<super::attributes::AerCounterFile>| {
        file.as_ref()
            .map_or("unknown".to_string(), |file| file.total.to_string())
    };
    let mut top: Vec<&(String, u64)> = [&aer.correctable, &aer.nonfatal, &aer.fatal]
        .into_iter()
        .flatten()
        .flat_map(|file| file.nonzero_counts.iter())
        .collect();
    top.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    let top: Vec<String> = top
        .iter()
        .take(3)
        .map(|(name, count)| format!("{name} {count}"))
        .collect();
    let score = device.health.unwrap_or_default();
    Finding {
        severity: Severity::Warning,
        kind: FindingKind::SubHealthy,
        device: Some(device.bdf),
        evidence: format!(
            "aer_dev_correctable TOTAL_ERR_COR={}, aer_dev_nonfatal TOTAL_ERR_NONFATAL={}, \
             aer_dev_fatal TOTAL_ERR_FATAL={} (most: {}): health {:.4} < {}",
            total(&aer.correctable),
            total(&aer.nonfatal),
            total(&aer.fatal),
            if top.is_empty() {
                "none".to_string()
            } else {
                top.join(", ")
            },
            score,
            topology.health_model.sub_healthy_below
        ),
        action: "the link replays or drops packets: check seating, risers, cables and \
                 retimers; the counters only grow until reboot, so watch their rate. The ring \
                 planner weighs paths through this device down"
            .to_string(),
    }
}

fn bar_findings(topology: &Topology, gpu: usize, findings: &mut Vec<Finding>) {
    let device = &topology.devices[gpu];
    if let Some(capability) = &device.resizable_bars {
        for entry in &capability.entries {
            let Some(max) = entry.max_supported_bytes() else {
                continue;
            };
            if entry.current_size_bytes < max {
                findings.push(Finding {
                    severity: Severity::Warning,
                    kind: FindingKind::SmallBar,
                    device: Some(device.bdf),
                    evidence: format!(
                        "Resizable BAR capability @{:#x}: BAR{} is {} but supports up to {}",
                        capability.offset,
                        entry.bar_index,
                        bytes_text(entry.current_size_bytes),
                        bytes_text(max)
                    ),
                    action: "enable Above 4G Decoding and Resizable BAR in the firmware so peers \
                             can map all of this GPU's memory through its BAR"
                        .to_string(),
                });
            }
        }
        return;
    }
    let largest = device
        .bars
        .iter()
        .flatten()
        .filter(|bar| bar.is_memory && bar.prefetchable)
        .map(|bar| (bar.index, bar.size_bytes))
        .max_by_key(|&(_, size)| size);
    if let Some((index, size)) = largest.filter(|&(_, size)| size < 1 << 30) {
        let why_unknown = if device.config_bytes_readable < super::config_space::EXTENDED_CONFIG_LEN
        {
            "Resizable BAR capability unknown (extended config space not readable)"
        } else {
            "no Resizable BAR capability"
        };
        findings.push(Finding {
            severity: Severity::Info,
            kind: FindingKind::SmallBar,
            device: Some(device.bdf),
            evidence: format!(
                "resource: largest prefetchable BAR{index} is {}; {why_unknown}",
                bytes_text(size)
            ),
            action: "peers reach GPU memory through this window only: enable Above 4G \
                     Decoding / Resizable BAR in the firmware if the GPU supports it"
                .to_string(),
        });
    }
}

/// One finding per IOMMU group that holds a GPU and other endpoints.
fn iommu_findings(topology: &Topology, gpus: &[usize], findings: &mut Vec<Finding>) {
    let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (index, device) in topology.devices.iter().enumerate() {
        if let (Some(group), false) = (device.iommu_group, device.kind.is_bridge()) {
            groups.entry(group).or_default().push(index);
        }
    }
    for (group, members) in groups {
        let Some(&first_gpu) = members.iter().find(|member| gpus.contains(member)) else {
            continue;
        };
        // Functions of one device (bus:device) always share a group.
        let slot = |index: usize| {
            let bdf = topology.devices[index].bdf;
            (bdf.domain, bdf.bus, bdf.device)
        };
        let slots: BTreeSet<_> = members.iter().map(|&member| slot(member)).collect();
        if slots.len() < 2 {
            continue;
        }
        let names: Vec<String> = members
            .iter()
            .map(|&member| topology.devices[member].bdf.to_string())
            .collect();
        findings.push(Finding {
            severity: Severity::Info,
            kind: FindingKind::IommuGroupShared,
            device: Some(topology.devices[first_gpu].bdf),
            evidence: format!(
                "iommu_group {group} holds the endpoints {}",
                names.join(", ")
            ),
            action: "no ACS isolation between these devices: the IOMMU cannot tell their DMA \
                     apart (harmless for P2P inside the host, matters for VFIO assignment)"
                .to_string(),
        });
    }
}

fn acs_findings(topology: &Topology, gpus: &[usize], findings: &mut Vec<Finding>) {
    let mut redirecting: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut unknown: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (position, &a) in gpus.iter().enumerate() {
        for &b in &gpus[position + 1..] {
            let acs = peer_acs(topology, &topology.path_between(a, b));
            let pair = format!("{}-{}", topology.devices[a].bdf, topology.devices[b].bdf);
            for port in acs.redirecting_ports {
                redirecting.entry(port).or_default().push(pair.clone());
            }
            for port in acs.unknown_ports {
                unknown.entry(port).or_default().push(pair.clone());
            }
        }
    }
    for (port, pairs) in redirecting {
        let device = &topology.devices[port];
        let Some(acs) = device.acs else { continue };
        findings.push(Finding {
            severity: Severity::Warning,
            kind: FindingKind::AcsRedirect,
            device: Some(device.bdf),
            evidence: format!(
                "ACS Control @{:#x}={:#06x} ({}); GPU pairs sent through the root complex: {}",
                acs.offset + 6,
                acs.control,
                acs.describe_control(),
                pairs.join(", ")
            ),
            action: format!(
                "P2P between these GPUs goes up to the root complex: slower, and it can hang \
                 with the IOMMU translating. Clear P2P Request/Completion Redirect on this port \
                 (kernel parameter pci=disable_acs_redir={}, or setpci -s {} ECAP_ACS+6.w=0) \
                 and use iommu=pt, or enable ATS with ACS Direct Translated P2P",
                device.bdf, device.bdf
            ),
        });
    }
    for (port, pairs) in unknown {
        let device = &topology.devices[port];
        findings.push(Finding {
            severity: Severity::Info,
            kind: FindingKind::AcsUnknown,
            device: Some(device.bdf),
            evidence: format!(
                "config readable to {} bytes{}: ACS (extended capability, offset >= 0x100) \
                 unknown for GPU pairs {}",
                device.config_bytes_readable,
                if device.config_bytes_readable <= STANDARD_HEADER_LEN {
                    " (unprivileged)"
                } else {
                    ""
                },
                pairs.join(", ")
            ),
            action: "run pcieipc probe as root to read ACS redirect state".to_string(),
        });
    }
}

fn bytes_text(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {unit}", bytes / size);
        }
    }
    format!("{bytes} B")
}
