//! The PCI tree built from raw sysfs records (no I/O): host bridges, ports,
//! endpoints, the physical links between them, and paths between devices in
//! `nvidia-smi topo -m` terms.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::attributes::Bar;
use super::bdf::Bdf;
use super::config_space::{
    AcsRegisters, AerRegisters, ConfigSpace, PciExpressCapability, PciePortType,
    ResizableBarCapability,
};
use super::error::ProbeError;
use super::health::{AerTotals, HealthBasis, HealthModel};
use super::link::{classify_link, Link, LinkSpeed};
use super::nvlink::{NvlinkConnection, NvlinkStatus, Nvlinks};
use super::sysfs::{self, AerCounters, SysfsDevice};
use crate::device::LinkControl;

/// A PCI host bridge (root complex), the `pciDDDD:BB` directory of sysfs.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBridge {
    pub name: String,
    pub domain: u32,
    pub bus: u8,
    /// NUMA node of the devices on it (sysfs reports it per device).
    pub numa_node: Option<u32>,
    pub local_cpulist: Option<String>,
    /// Devices on its root bus, in bus-id order.
    pub children: Vec<usize>,
}

/// What is above a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    HostBridge(usize),
    Device(usize),
}

/// The role of a function in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    RootPort,
    SwitchUpstreamPort,
    SwitchDownstreamPort,
    /// Any other bridge (PCIe-to-PCI, conventional PCI-to-PCI).
    Bridge,
    Endpoint,
}

impl DeviceKind {
    pub fn is_bridge(self) -> bool {
        self != DeviceKind::Endpoint
    }
}

/// A link end as one function reports it: sysfs attributes, completed from
/// its own config space where sysfs lacks them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkEnd {
    pub current_speed: Option<LinkSpeed>,
    pub current_width: Option<u8>,
    pub max_speed: Option<LinkSpeed>,
    pub max_width: Option<u8>,
    pub target_speed: Option<LinkSpeed>,
}

/// One PCI function.
#[derive(Debug, Clone, PartialEq)]
pub struct PciDevice {
    pub bdf: Bdf,
    /// Its directory under `<root>/sys/devices`.
    pub path: PathBuf,
    pub upstream: Upstream,
    pub host_bridge: usize,
    /// Number of bridges above it.
    pub depth: usize,
    /// Functions on its secondary bus, in bus-id order.
    pub children: Vec<usize>,
    pub kind: DeviceKind,
    pub class_code: Option<u32>,
    pub vendor_id: Option<u16>,
    pub device_id: Option<u16>,
    pub driver: Option<String>,
    pub numa_node: Option<u32>,
    pub local_cpulist: Option<String>,
    pub iommu_group: Option<u32>,
    pub bars: Option<Vec<Bar>>,
    /// Bytes of config space that could be read (0: none).
    pub config_bytes_readable: usize,
    pub pci_express: Option<PciExpressCapability>,
    pub link_end: LinkEnd,
    pub aer: AerCounters,
    pub aer_registers: Option<AerRegisters>,
    pub acs: Option<AcsRegisters>,
    pub resizable_bars: Option<ResizableBarCapability>,
    /// Health score from its own AER counters; without them (`aer_reported`
    /// false), from the state of the link above it; `None` when neither is known.
    pub health: Option<f64>,
    pub is_gpu: bool,
}

impl PciDevice {
    /// Whether the kernel exposes this device's AER counters (`aer_dev_*`):
    /// VMs and kernels without AER support show none.
    pub fn aer_reported(&self) -> bool {
        self.aer.correctable.is_some() || self.aer.nonfatal.is_some() || self.aer.fatal.is_some()
    }

    /// The totals of its AER counter files (a missing file counts 0);
    /// `None` when the kernel shows none of them.
    pub fn aer_totals(&self) -> Option<AerTotals> {
        let total = |file: &Option<super::attributes::AerCounterFile>| {
            file.as_ref().map_or(0, |file| file.total)
        };
        self.aer_reported().then(|| AerTotals {
            correctable: total(&self.aer.correctable),
            nonfatal: total(&self.aer.nonfatal),
            fatal: total(&self.aer.fatal),
        })
    }
}

/// Class codes (class << 8 | subclass) that make a device a GPU, from any
/// vendor: VGA, 3D controller, processing accelerator.
const GPU_CLASSES: [u32; 3] = [0x0300, 0x0302, 0x1200];
/// ASPEED, whose BMC display controller is class VGA on most servers.
const VENDOR_ASPEED: u16 = 0x1a03;

/// Path class of a device pair, named as in `nvidia-smi topo -m`, nearest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum PathClass {
    /// Through at most one PCIe switch.
    #[serde(rename = "PIX")]
    Pix,
    /// Through several PCIe switches, not through a host bridge.
    #[serde(rename = "PXB")]
    Pxb,
    /// Through one PCIe host bridge (the CPU's root complex).
    #[serde(rename = "PHB")]
    Phb,
    /// Between host bridges of one NUMA node.
    #[serde(rename = "NODE")]
    Node,
    /// Across the SMP interconnect between NUMA nodes.
    #[serde(rename = "SYS")]
    Sys,
}

impl PathClass {
    pub fn as_str(self) -> &'static str {
        match self {
            PathClass::Pix => "PIX",
            PathClass::Pxb => "PXB",
            PathClass::Phb => "PHB",
            PathClass::Node => "NODE",
            PathClass::Sys => "SYS",
        }
    }
}

/// The path between two devices.
#[derive(Debug, Clone, PartialEq)]
pub struct DevicePath {
    pub class: PathClass,
    /// Lowest bridge above both; `None` when the path crosses host bridges.
    pub common_bridge: Option<usize>,
    /// Bridges traversed, the common one included.
    pub bridges: Vec<usize>,
    /// Indices into `Topology::links` of the physical links traversed.
    pub links: Vec<usize>,
    /// The link with the lowest effective bandwidth, and that bandwidth
    /// (GB/s per direction); `None` when no link speed on the path is known.
    pub bottleneck: Option<(usize, f64)>,
    /// Links on the path whose speed or width is unknown.
    pub unknown_links: usize,
    /// Lowest health score of the devices on the path.
    pub health: Option<f64>,
    /// The NVLink connection between two GPUs, which P2P traffic takes
    /// instead of the PCIe path when there is one.
    pub nvlink: Option<NvlinkConnection>,
}

impl DevicePath {
    /// Physical links traversed.
    pub fn hops(&self) -> usize {
        self.links.len()
    }
}

/// The probed PCI topology.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub host_bridges: Vec<HostBridge>,
    /// In bus-id order.
    pub devices: Vec<PciDevice>,
    /// One per device that hangs below a root or downstream port.
    pub links: Vec<Link>,
    /// For each device, the index of the link above it.
    link_above: Vec<Option<usize>>,
    index_of: HashMap<Bdf, usize>,
    pub health_model: HealthModel,
    /// What NVML says of NVLink; `NotRead` until `with_nvlinks`.
    pub nvlinks: Nvlinks,
    /// The devices root allowed pcieipc to retrain the links of (the module
    /// parameter `link_control`); `None` where the module is not loaded.
    pub link_control: Option<Vec<Bdf>>,
}

impl Topology {
    /// Probes `<root>/sys` (`root` is `/` on a live system). A link control
    /// list that cannot be read counts as the module not being loaded: the
    /// probe then says how to load it.
    pub fn from_sysfs_root(root: &Path, health_model: HealthModel) -> Result<Topology, ProbeError> {
        Ok(Topology::from_devices(
            root,
            sysfs::read_devices(root)?,
            health_model,
        ))
    }

    /// As `from_sysfs_root`, from devices already read under `root`.
    pub fn from_devices(
        root: &Path,
        records: Vec<SysfsDevice>,
        health_model: HealthModel,
    ) -> Topology {
        Topology {
            link_control: LinkControl::new(root).allowed().ok(),
            ..Topology::build(records, health_model)
        }
    }

    /// Builds the tree from raw records (any order).
    pub fn build(mut records: Vec<SysfsDevice>, health_model: HealthModel) -> Topology {
        records.sort_by_key(|record| record.bdf);
        let index_of: HashMap<Bdf, usize> = records
            .iter()
            .enumerate()
            .map(|(index, record)| (record.bdf, index))
            .collect();

        let mut host_bridges: Vec<HostBridge> = Vec::new();
        let mut bridge_index: HashMap<String, usize> = HashMap::new();
        for record in &records {
            let name = &record.placement.host_bridge;
            if !bridge_index.contains_key(name) {
                let (domain, bus) = sysfs::parse_host_bridge_name(name).unwrap_or((0, 0));
                bridge_index.insert(name.clone(), host_bridges.len());
                host_bridges.push(HostBridge {
                    name: name.clone(),
                    domain,
                    bus,
                    numa_node: None,
                    local_cpulist: None,
                    children: Vec::new(),
                });
            }
        }
        host_bridges.sort_by_key(|bridge| (bridge.domain, bridge.bus));
        for (index, bridge) in host_bridges.iter().enumerate() {
            bridge_index.insert(bridge.name.clone(), index);
        }

        let mut devices: Vec<PciDevice> = records
            .into_iter()
            .map(|record| {
                let host_bridge = bridge_index[&record.placement.host_bridge];
                // A parent missing from the list cannot happen on a live
                // system; the device then hangs on its host bridge.
                let upstream = record
                    .placement
                    .parent
                    .and_then(|parent| index_of.get(&parent).copied())
                    .map_or(Upstream::HostBridge(host_bridge), Upstream::Device);
                device_from_record(record, upstream, host_bridge, &health_model)
            })
            .collect();

        // Depth and kinds, parents first.
        for index in 0..devices.len() {
            let mut depth = 0;
            let mut cursor = devices[index].upstream;
            while let Upstream::Device(parent) = cursor {
                depth += 1;
                cursor = devices[parent].upstream;
            }
            devices[index].depth = depth;
        }
        let mut by_depth: Vec<usize> = (0..devices.len()).collect();
        by_depth.sort_by_key(|&index| (devices[index].depth, index));
        for &index in &by_depth {
            let parent_kind = match devices[index].upstream {
                Upstream::Device(parent) => Some(devices[parent].kind),
                Upstream::HostBridge(_) => None,
            };
            devices[index].kind = device_kind(&devices[index], parent_kind);
        }
        for index in 0..devices.len() {
            match devices[index].upstream {
                Upstream::Device(parent) => devices[parent].children.push(index),
                Upstream::HostBridge(bridge) => host_bridges[bridge].children.push(index),
            }
        }
        for bridge in &mut host_bridges {
            let first = bridge.children.first().map(|&child| &devices[child]);
            bridge.numa_node = first.and_then(|device| device.numa_node);
            bridge.local_cpulist = first.and_then(|device| device.local_cpulist.clone());
        }

        let mut links = Vec::new();
        let mut link_above = vec![None; devices.len()];
        for (index, device) in devices.iter().enumerate() {
            let port = match device.upstream {
                Upstream::Device(parent)
                    if matches!(
                        devices[parent].kind,
                        DeviceKind::RootPort | DeviceKind::SwitchDownstreamPort
                    ) =>
                {
                    Some(parent)
                }
                Upstream::HostBridge(_) if reports_own_link(device) => None,
                Upstream::Device(_) | Upstream::HostBridge(_) => continue,
            };
            link_above[index] = Some(links.len());
            links.push(link_between(
                index,
                device,
                port.map(|parent| (parent, &devices[parent])),
            ));
        }
        // Without AER counters the state of the link above is all that is
        // known of a device's health; links then take their ends' scores.
        for (index, device) in devices.iter_mut().enumerate() {
            if !device.aer_reported() {
                device.health = link_above[index].and_then(|link| links[link].state_score());
            }
        }
        for link in &mut links {
            let port_health = link.upstream.and_then(|port| devices[port].health);
            link.health = lower_score(devices[link.downstream].health, port_health);
        }

        Topology {
            host_bridges,
            devices,
            links,
            link_above,
            index_of,
            health_model,
            nvlinks: Nvlinks::without(NvlinkStatus::NotRead),
            link_control: None,
        }
    }

    /// The topology with NVML's view of NVLink (from `probe::nvml`).
    pub fn with_nvlinks(self, nvlinks: Nvlinks) -> Topology {
        Topology { nvlinks, ..self }
    }

    pub fn find(&self, bdf: Bdf) -> Option<usize> {
        self.index_of.get(&bdf).copied()
    }

    /// GPUs, in bus-id order (the order CUDA and NCCL number them by default).
    pub fn gpus(&self) -> Vec<usize> {
        (0..self.devices.len())
            .filter(|&index| self.devices[index].is_gpu)
            .collect()
    }

    /// The link between a device and the port above it.
    pub fn link_above(&self, device: usize) -> Option<&Link> {
        self.link_above[device].map(|link| &self.links[link])
    }

    pub fn parent(&self, device: usize) -> Option<usize> {
        match self.devices[device].upstream {
            Upstream::Device(parent) => Some(parent),
            Upstream::HostBridge(_) => None,
        }
    }

    /// The device and the bridges above it, nearest first.
    fn chain_up(&self, device: usize) -> Vec<usize> {
        std::iter::successors(Some(device), |&current| self.parent(current)).collect()
    }

    /// Links from a device up to its host bridge, nearest first.
    pub fn links_to_root(&self, device: usize) -> Vec<usize> {
        self.chain_up(device)
            .into_iter()
            .filter_map(|index| self.link_above[index])
            .collect()
    }

    /// The link with the lowest effective bandwidth among `links`, with that
    /// bandwidth in GB/s; links of unknown speed are skipped.
    pub fn bottleneck(&self, links: &[usize]) -> Option<(usize, f64)> {
        links
            .iter()
            .filter_map(|&link| Some((link, self.links[link].effective_bandwidth_gbps()?)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// The path between two devices.
    pub fn path_between(&self, a: usize, b: usize) -> DevicePath {
        let up_a = self.chain_up(a);
        let up_b = self.chain_up(b);
        let common = up_a.iter().copied().find(|index| up_b.contains(index));
        let below_common = |chain: &[usize]| -> Vec<usize> {
            chain
                .iter()
                .copied()
                .take_while(|&index| Some(index) != common)
                .collect()
        };
        let side_a = below_common(&up_a);
        let side_b = below_common(&up_b);
        let on_path: Vec<usize> = side_a
            .iter()
            .chain(side_b.iter())
            .copied()
            .chain(common)
            .collect();
        let bridges: Vec<usize> = on_path
            .iter()
            .copied()
            .filter(|&index| index != a && index != b && self.devices[index].kind.is_bridge())
            .collect();
        let links: Vec<usize> = side_a
            .iter()
            .chain(side_b.iter())
            .filter_map(|&index| self.link_above[index])
            .collect();
        let class = match common {
            Some(_) => {
                let mut switches: Vec<usize> = bridges
                    .iter()
                    .map(|&bridge| self.switch_of(bridge))
                    .collect();
                switches.sort_unstable();
                switches.dedup();
                if switches.len() <= 1 {
                    PathClass::Pix
                } else {
                    PathClass::Pxb
                }
            }
            None => {
                let bridge_a = &self.host_bridges[self.devices[a].host_bridge];
                let bridge_b = &self.host_bridges[self.devices[b].host_bridge];
                if bridge_a.name == bridge_b.name {
                    PathClass::Phb
                } else if bridge_a.numa_node == bridge_b.numa_node {
                    PathClass::Node
                } else {
                    PathClass::Sys
                }
            }
        };
        let health = on_path
            .iter()
            .filter_map(|&index| self.devices[index].health)
            .min_by(f64::total_cmp);
        let nvlink = if self.devices[a].is_gpu && self.devices[b].is_gpu {
            self.nvlinks
                .connection(self.devices[a].bdf, self.devices[b].bdf)
        } else {
            None
        };
        DevicePath {
            class,
            common_bridge: common,
            nvlink,
            bottleneck: self.bottleneck(&links),
            unknown_links: links
                .iter()
                .filter(|&&link| self.links[link].effective_bandwidth_gbps().is_none())
                .count(),
            bridges,
            links,
            health,
        }
    }

    /// The switch a bridge belongs to: a downstream port's upstream port, so
    /// that the ports of one switch count as one bridge (as nvidia-smi does).
    fn switch_of(&self, bridge: usize) -> usize {
        match (self.devices[bridge].kind, self.parent(bridge)) {
            (DeviceKind::SwitchDownstreamPort, Some(parent))
                if self.devices[parent].kind == DeviceKind::SwitchUpstreamPort =>
            {
                parent
            }
            _ => bridge,
        }
    }

    /// What a device's health score rests on; `None` without a score.
    pub fn health_basis(&self, device: usize) -> Option<HealthBasis> {
        let device = &self.devices[device];
        device.health?;
        Some(if device.aer_reported() {
            HealthBasis::AerCounters
        } else {
            HealthBasis::LinkState
        })
    }

    /// Whether any device shows AER counters: kernels without AER support
    /// and most VMs show none.
    pub fn aer_reported(&self) -> bool {
        self.devices.iter().any(PciDevice::aer_reported)
    }

    pub fn is_sub_healthy(&self, device: usize) -> bool {
        self.devices[device]
            .health
            .is_some_and(|score| self.health_model.is_sub_healthy(score))
    }
}

fn device_from_record(
    record: SysfsDevice,
    upstream: Upstream,
    host_bridge: usize,
    health_model: &HealthModel,
) -> PciDevice {
    let config = ConfigSpace::new(record.config.as_deref().unwrap_or_default());
    let pci_express = config.pci_express();
    let registers = pci_express.and_then(|capability| capability.link);
    let attributes = record.link;
    let link_end = LinkEnd {
        current_speed: attributes
            .current_speed
            .or_else(|| registers?.current_speed()),
        current_width: attributes
            .current_width
            .or_else(|| Some(registers?.current_width())),
        max_speed: attributes.max_speed.or_else(|| registers?.max_speed()),
        max_width: attributes
            .max_width
            .or_else(|| Some(registers?.max_width())),
        target_speed: registers.and_then(|registers| registers.target_speed()),
    };
    let is_gpu = record
        .class_code
        .is_some_and(|class| GPU_CLASSES.contains(&(class >> 8)))
        && record.vendor_id != Some(VENDOR_ASPEED);
    let mut device = PciDevice {
        bdf: record.bdf,
        path: record.path,
        upstream,
        host_bridge,
        depth: 0,
        children: Vec::new(),
        kind: DeviceKind::Endpoint,
        class_code: record.class_code,
        vendor_id: record.vendor_id,
        device_id: record.device_id,
        driver: record.driver,
        numa_node: record.numa_node,
        local_cpulist: record.local_cpulist,
        iommu_group: record.iommu_group,
        bars: record.bars,
        config_bytes_readable: config.len(),
        pci_express,
        link_end,
        aer: record.aer,
        aer_registers: config.advanced_error_reporting(),
        acs: config.access_control_services(),
        resizable_bars: config.resizable_bars(),
        // Without AER counters, set from the link above once links are built.
        health: None,
        is_gpu,
    };
    device.health = device
        .aer_totals()
        .map(|totals| health_model.score_totals(&totals));
    device
}

/// PCI-to-PCI bridge class codes (normal and subtractive decode).
const BRIDGE_CLASSES: [u32; 2] = [0x0604, 0x0609];

/// The port type from the PCIe capability when readable; otherwise inferred
/// from the bridge class and the parent, which is how PCIe trees are built
/// (a root port's child bridge is a switch upstream port, whose children are
/// its downstream ports).
fn device_kind(device: &PciDevice, parent_kind: Option<DeviceKind>) -> DeviceKind {
    if let Some(capability) = device.pci_express {
        return match capability.port_type {
            PciePortType::RootPort => DeviceKind::RootPort,
            PciePortType::SwitchUpstreamPort => DeviceKind::SwitchUpstreamPort,
            PciePortType::SwitchDownstreamPort => DeviceKind::SwitchDownstreamPort,
            PciePortType::PcieToPciBridge | PciePortType::PciToPcieBridge => DeviceKind::Bridge,
            _ => DeviceKind::Endpoint,
        };
    }
    let is_bridge = device
        .class_code
        .is_some_and(|class| BRIDGE_CLASSES.contains(&(class >> 8)));
    match (is_bridge, parent_kind) {
        (false, _) => DeviceKind::Endpoint,
        (true, None) => DeviceKind::RootPort,
        (true, Some(DeviceKind::RootPort | DeviceKind::SwitchDownstreamPort)) => {
            DeviceKind::SwitchUpstreamPort
        }
        (true, Some(DeviceKind::SwitchUpstreamPort)) => DeviceKind::SwitchDownstreamPort,
        (true, Some(_)) => DeviceKind::Bridge,
    }
}

/// An endpoint on a root bus whose own link registers or attributes report a
/// link: the port above it is hidden (a VM), not absent. Root complex
/// integrated functions have no link.
fn reports_own_link(device: &PciDevice) -> bool {
    let integrated = device.pci_express.is_some_and(|capability| {
        matches!(
            capability.port_type,
            PciePortType::RootComplexIntegratedEndpoint | PciePortType::RootComplexEventCollector
        )
    });
    device.kind == DeviceKind::Endpoint
        && !integrated
        && (device.link_end.current_speed.is_some() || device.link_end.current_width.is_some())
}

fn lower_score(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Combines the two ends' views of one link: current values from whichever
/// end reports them (the device below first), capability as the lower of the
/// two ends, target speed from the port above. Without a visible port the
/// device's own view is the link's.
fn link_between(index: usize, device: &PciDevice, port: Option<(usize, &PciDevice)>) -> Link {
    let below = device.link_end;
    let above = port.map(|(_, port)| port.link_end).unwrap_or_default();
    let lower = |a: Option<LinkSpeed>, b: Option<LinkSpeed>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let narrower = |a: Option<u8>, b: Option<u8>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let current_speed = below.current_speed.or(above.current_speed);
    let current_width = below.current_width.or(above.current_width);
    let max_speed = lower(below.max_speed, above.max_speed);
    let max_width = narrower(below.max_width, above.max_width);
    let target_speed = above.target_speed.or(below.target_speed);
    Link {
        downstream: index,
        upstream: port.map(|(parent, _)| parent),
        current_speed,
        current_width,
        max_speed,
        max_width,
        target_speed,
        state: classify_link(
            current_speed,
            current_width,
            max_speed,
            max_width,
            target_speed,
            device.is_gpu,
        ),
        // Set by `Topology::build` once both ends' scores are known.
        health: None,
    }
}
