//! The probe's output model: everything `pcieipc probe` shows, serialisable
//! as the versioned JSON document of docs/schemas/probe-v2.schema.json.

use serde::Serialize;

use super::attributes::Bar;
use super::bdf::Bdf;
use super::config_space::{PciePortType, ResizableBar};
use super::doctor::{diagnose, peer_acs, Finding, PeerRoute, Severity};
use super::health::{HealthBasis, HealthModel};
use super::link::{LinkSpeed, LinkState};
use super::names::{class_name, vendor_name};
use super::nvlink::{GpuNvlinkState, NvlinkConnection, NvlinkStatus};
use super::retrain::{retrainability, Retrainability};
use super::topology::{DeviceKind, PathClass, Topology, Upstream};
use crate::plan::{best_ring, bus_id_order_ring, pair_matrix, CostModel, Ring, RingMethod};

/// Version of the JSON document; bumped on any incompatible change. 2: a
/// link's `upstream_port` may be null (an endpoint's own link under a hidden
/// port), a pair's `class` is nvidia-smi's (`NV18` over NVLink) with the PCIe
/// class in `pcie_class`, and health says what it rests on.
pub const SCHEMA_VERSION: u32 = 2;

/// The probe's line where the kernel shows no AER counters.
pub const AER_NOT_REPORTED: &str = "AER: not reported by this kernel/VM (no aer_dev_* files)";

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeReport {
    pub schema_version: u32,
    pub health_model: HealthModel,
    /// Whether any device shows AER counters (`aer_dev_*`); false on kernels
    /// without AER support and in most VMs, where health rests on link state.
    pub aer_reported: bool,
    pub nvlink: NvlinkReport,
    pub host_bridges: Vec<HostBridgeReport>,
    /// In bus-id order.
    pub devices: Vec<DeviceReport>,
    /// In bus-id order; `index` is the CUDA/NCCL default numbering.
    pub gpus: Vec<GpuReport>,
    pub gpu_pairs: Vec<GpuPairReport>,
    /// Most severe first.
    pub findings: Vec<Finding>,
    pub ring: RingReport,
}

/// What is known of NVLink, in one line and as a state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NvlinkReport {
    #[serde(flatten)]
    pub status: NvlinkStatus,
    /// The probe's line about it.
    pub summary: String,
    pub driver_version: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostBridgeReport {
    pub name: String,
    pub domain: u32,
    pub bus: u8,
    pub numa_node: Option<u32>,
    pub local_cpulist: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceReport {
    pub bdf: Bdf,
    /// The bridge above; `None` on a host bridge's root bus.
    pub parent: Option<Bdf>,
    pub host_bridge: String,
    pub kind: DeviceKind,
    /// "0x030200".
    pub class_code: Option<String>,
    pub class_name: Option<&'static str>,
    /// "0x10de".
    pub vendor_id: Option<String>,
    pub vendor_name: Option<&'static str>,
    pub device_id: Option<String>,
    pub driver: Option<String>,
    pub numa_node: Option<u32>,
    pub local_cpulist: Option<String>,
    pub iommu_group: Option<u32>,
    pub is_gpu: bool,
    pub config_bytes_readable: usize,
    pub pcie_port_type: Option<PciePortType>,
    /// The link to the port above; `None` when there is none (root bus,
    /// inside a switch).
    pub link: Option<LinkReport>,
    pub aer: Option<AerReport>,
    pub health: Option<f64>,
    pub health_basis: Option<HealthBasis>,
    pub sub_healthy: bool,
    pub acs: Option<AcsReport>,
    pub bars: Option<Vec<Bar>>,
    pub resizable_bars: Option<Vec<ResizableBar>>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkReport {
    /// `None`: the port above is not visible (an endpoint on a VM's root bus)
    /// and the link is as the device itself reports it.
    pub upstream_port: Option<Bdf>,
    pub current_speed_gts: Option<LinkSpeed>,
    pub current_width: Option<u8>,
    pub max_speed_gts: Option<LinkSpeed>,
    pub max_width: Option<u8>,
    pub target_speed_gts: Option<LinkSpeed>,
    pub state: LinkState,
    pub current_bandwidth_gbps: Option<f64>,
    pub effective_bandwidth_gbps: Option<f64>,
    pub health: Option<f64>,
    /// For a degraded link: whether pcieipc may retrain it, and if not the
    /// line that would allow it.
    pub retrain: Option<Retrainability>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AerReport {
    pub correctable_total: Option<u64>,
    pub nonfatal_total: Option<u64>,
    pub fatal_total: Option<u64>,
    /// Non-zero per-type counts, "Name" -> count.
    pub nonzero_counts: Vec<(String, u64)>,
    pub rootport_total_correctable: Option<u64>,
    pub rootport_total_nonfatal: Option<u64>,
    pub rootport_total_fatal: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AcsReport {
    pub offset: usize,
    pub capability: u16,
    pub control: u16,
    /// As lspci prints it: "SrcValid+ TransBlk- ReqRedir+ ...".
    pub control_decoded: String,
    pub redirects_peer_to_peer: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuReport {
    pub index: usize,
    pub bdf: Bdf,
    pub numa_node: Option<u32>,
    pub local_cpulist: Option<String>,
    pub health: Option<f64>,
    pub health_basis: Option<HealthBasis>,
    pub sub_healthy: bool,
    pub link_state: Option<LinkState>,
    /// The slowest link between this GPU and its host bridge.
    pub bottleneck_to_root: Option<BottleneckReport>,
    pub unknown_links_to_root: usize,
    /// What NVML said of its NVLinks; `None` when NVML was not read or did
    /// not list this GPU.
    pub nvlink: Option<GpuNvlinkState>,
}

/// A link named by the device below it, with its effective bandwidth.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BottleneckReport {
    pub link_above: Bdf,
    pub bandwidth_gbps: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuPairReport {
    pub a: usize,
    pub b: usize,
    /// As `nvidia-smi topo -m` prints it: `NV18` over NVLink, else the PCIe class.
    pub class: String,
    pub pcie_class: PathClass,
    pub nvlink: Option<NvlinkConnection>,
    /// PCIe links traversed.
    pub hops: usize,
    pub bottleneck: Option<BottleneckReport>,
    pub unknown_links: usize,
    pub health: Option<f64>,
    pub p2p_route: PeerRoute,
    pub acs_redirecting_ports: Vec<Bdf>,
    pub acs_unknown_ports: Vec<Bdf>,
    /// Pair bandwidth and cost in the ring cost model.
    pub model_bandwidth_gbps: f64,
    pub model_cost_us: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RingReport {
    pub cost_model: CostModel,
    /// The planned ring; `None` with fewer than two GPUs.
    pub best: Option<RingPlanReport>,
    /// GPUs in bus-id order, NCCL's default.
    pub nccl_default: Option<RingPlanReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RingPlanReport {
    pub method: RingMethod,
    /// GPU indices.
    pub order: Vec<usize>,
    pub order_bdf: Vec<Bdf>,
    pub bottleneck_gbps: f64,
    pub total_cost_us: f64,
}

impl ProbeReport {
    pub fn new(topology: &Topology, cost_model: &CostModel) -> ProbeReport {
        let gpus = topology.gpus();
        let matrix = pair_matrix(topology, &gpus, cost_model);
        let bdf_of = |index: usize| topology.devices[index].bdf;
        let bottleneck_report = |found: Option<(usize, f64)>| {
            found.map(|(link, bandwidth_gbps)| BottleneckReport {
                link_above: bdf_of(topology.links[link].downstream),
                bandwidth_gbps,
            })
        };
        let ring_report = |ring: Ring| RingPlanReport {
            order_bdf: ring
                .order
                .iter()
                .map(|&member| bdf_of(gpus[member]))
                .collect(),
            method: ring.method,
            order: ring.order,
            bottleneck_gbps: ring.bottleneck_gbps,
            total_cost_us: ring.total_cost_us,
        };
        let mut gpu_pairs = Vec::new();
        for a in 0..gpus.len() {
            for b in a + 1..gpus.len() {
                let path = topology.path_between(gpus[a], gpus[b]);
                let acs = peer_acs(topology, &path);
                gpu_pairs.push(GpuPairReport {
                    a,
                    b,
                    class: path
                        .nvlink
                        .map_or_else(|| path.class.as_str().to_string(), |nvlink| nvlink.label()),
                    pcie_class: path.class,
                    nvlink: path.nvlink,
                    hops: path.hops(),
                    bottleneck: bottleneck_report(path.bottleneck),
                    unknown_links: path.unknown_links,
                    health: path.health,
                    p2p_route: acs.route,
                    acs_redirecting_ports: acs.redirecting_ports.into_iter().map(bdf_of).collect(),
                    acs_unknown_ports: acs.unknown_ports.into_iter().map(bdf_of).collect(),
                    model_bandwidth_gbps: matrix.bandwidth(a, b),
                    model_cost_us: matrix.cost(a, b),
                });
            }
        }
        ProbeReport {
            schema_version: SCHEMA_VERSION,
            health_model: topology.health_model,
            aer_reported: topology.aer_reported(),
            nvlink: NvlinkReport {
                status: topology.nvlinks.status.clone(),
                summary: topology.nvlinks.status.describe(),
                driver_version: topology.nvlinks.driver_version.clone(),
            },
            host_bridges: topology
                .host_bridges
                .iter()
                .map(|bridge| HostBridgeReport {
                    name: bridge.name.clone(),
                    domain: bridge.domain,
                    bus: bridge.bus,
                    numa_node: bridge.numa_node,
                    local_cpulist: bridge.local_cpulist.clone(),
                })
                .collect(),
            devices: (0..topology.devices.len())
                .map(|index| device_report(topology, index))
                .collect(),
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(position, &gpu)| {
                    let device = &topology.devices[gpu];
                    let to_root = topology.links_to_root(gpu);
                    GpuReport {
                        index: position,
                        bdf: device.bdf,
                        numa_node: device.numa_node,
                        local_cpulist: device.local_cpulist.clone(),
                        health: device.health,
                        health_basis: topology.health_basis(gpu),
                        sub_healthy: topology.is_sub_healthy(gpu),
                        link_state: topology.link_above(gpu).map(|link| link.state),
                        bottleneck_to_root: bottleneck_report(topology.bottleneck(&to_root)),
                        unknown_links_to_root: to_root
                            .iter()
                            .filter(|&&link| {
                                topology.links[link].effective_bandwidth_gbps().is_none()
                            })
                            .count(),
                        nvlink: topology.nvlinks.gpus.get(&device.bdf).cloned(),
                    }
                })
                .collect(),
            gpu_pairs,
            findings: diagnose(topology),
            ring: RingReport {
                cost_model: *cost_model,
                best: best_ring(&matrix).map(ring_report),
                nccl_default: bus_id_order_ring(&matrix).map(ring_report),
            },
        }
    }

    /// The most severe finding's severity.
    pub fn worst_severity(&self) -> Option<Severity> {
        self.findings.iter().map(|finding| finding.severity).max()
    }
}

fn device_report(topology: &Topology, index: usize) -> DeviceReport {
    let device = &topology.devices[index];
    let aer = &device.aer;
    let has_aer = aer.correctable.is_some()
        || aer.nonfatal.is_some()
        || aer.fatal.is_some()
        || aer.rootport_total_correctable.is_some();
    DeviceReport {
        bdf: device.bdf,
        parent: match device.upstream {
            Upstream::Device(parent) => Some(topology.devices[parent].bdf),
            Upstream::HostBridge(_) => None,
        },
        host_bridge: topology.host_bridges[device.host_bridge].name.clone(),
        kind: device.kind,
        class_code: device.class_code.map(|class| format!("{class:#08x}")),
        class_name: device.class_code.map(class_name),
        vendor_id: device.vendor_id.map(|id| format!("{id:#06x}")),
        vendor_name: device.vendor_id.and_then(vendor_name),
        device_id: device.device_id.map(|id| format!("{id:#06x}")),
        driver: device.driver.clone(),
        numa_node: device.numa_node,
        local_cpulist: device.local_cpulist.clone(),
        iommu_group: device.iommu_group,
        is_gpu: device.is_gpu,
        config_bytes_readable: device.config_bytes_readable,
        pcie_port_type: device.pci_express.map(|capability| capability.port_type),
        link: topology.link_above(index).map(|link| LinkReport {
            upstream_port: link.upstream.map(|port| topology.devices[port].bdf),
            current_speed_gts: link.current_speed,
            current_width: link.current_width,
            max_speed_gts: link.max_speed,
            max_width: link.max_width,
            target_speed_gts: link.target_speed,
            state: link.state,
            current_bandwidth_gbps: link.current_bandwidth_gbps(),
            effective_bandwidth_gbps: link.effective_bandwidth_gbps(),
            health: link.health,
            retrain: (link.state == LinkState::Degraded)
                .then(|| retrainability(topology, link, topology.link_control.as_deref())),
        }),
        aer: has_aer.then(|| AerReport {
            correctable_total: aer.correctable.as_ref().map(|file| file.total),
            nonfatal_total: aer.nonfatal.as_ref().map(|file| file.total),
            fatal_total: aer.fatal.as_ref().map(|file| file.total),
            nonzero_counts: [&aer.correctable, &aer.nonfatal, &aer.fatal]
                .into_iter()
                .flatten()
                .flat_map(|file| file.nonzero_counts.iter())
                .cloned()
                .collect(),
            rootport_total_correctable: aer.rootport_total_correctable,
            rootport_total_nonfatal: aer.rootport_total_nonfatal,
            rootport_total_fatal: aer.rootport_total_fatal,
        }),
        health: device.health,
        health_basis: topology.health_basis(index),
        sub_healthy: topology.is_sub_healthy(index),
        acs: device.acs.map(|acs| AcsReport {
            offset: acs.offset,
            capability: acs.capability,
            control: acs.control,
            control_decoded: acs.describe_control(),
            redirects_peer_to_peer: acs.redirects_peer_to_peer(),
        }),
        bars: device.bars.clone(),
        resizable_bars: device
            .resizable_bars
            .as_ref()
            .map(|capability| capability.entries.clone()),
    }
}
