//! The probe on the committed fixtures: the DGX-like 8-GPU tree (synthetic,
//! with a degraded link, a sub-healthy GPU, ACS redirect on one switch, an
//! idle GPU and a small BAR) and the capture of the development VM (virtio
//! devices, no link attributes).

#[path = "../../../tests/fixtures/sysfs/generator.rs"]
mod generator;

use pcieipc::plan::{CostModel, RingMethod};
use pcieipc::probe::retrain::retrainability;
use pcieipc::probe::{
    Bdf, DeviceKind, FindingKind, HealthModel, LinkSpeed, LinkState, PathClass, PeerRoute,
    ProbeReport, Severity, Topology,
};

fn probe(name: &str) -> Topology {
    Topology::from_sysfs_root(&generator::fixture_root(name), HealthModel::default()).unwrap()
}

fn bdf(text: &str) -> Bdf {
    text.parse().unwrap()
}

fn index(topology: &Topology, text: &str) -> usize {
    topology.find(bdf(text)).unwrap()
}

fn validate_against_schema(report: &ProbeReport) {
    let schema_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/schemas/probe-v2.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(schema_path).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let instance = serde_json::to_value(report).unwrap();
    assert_eq!(instance["schema_version"], 2);
    let errors: Vec<String> = validator
        .iter_errors(&instance)
        .map(|error| format!("{} at {}", error, error.instance_path()))
        .collect();
    assert!(errors.is_empty(), "schema violations: {errors:#?}");
}

const DGX_GPUS: [&str; 8] = [
    "0000:05:00.0",
    "0000:06:00.0",
    "0000:0a:00.0",
    "0000:0b:00.0",
    "0000:85:00.0",
    "0000:86:00.0",
    "0000:8a:00.0",
    "0000:8b:00.0",
];

/// 16 GT/s lane after 128b/130b, in GB/s.
const GEN4_LANE: f64 = 16.0 * 128.0 / 130.0 / 8.0;

#[test]
fn dgx8_tree_has_two_switch_levels_under_each_socket() {
    let topology = probe("dgx8");
    assert_eq!(topology.devices.len(), 38);
    let bridges: Vec<(&str, Option<u32>)> = topology
        .host_bridges
        .iter()
        .map(|bridge| (bridge.name.as_str(), bridge.numa_node))
        .collect();
    assert_eq!(bridges, [("pci0000:00", Some(0)), ("pci0000:80", Some(1))]);
    let kind = |text: &str| topology.devices[index(&topology, text)].kind;
    assert_eq!(kind("0000:00:00.0"), DeviceKind::Endpoint);
    assert_eq!(kind("0000:00:01.0"), DeviceKind::RootPort);
    assert_eq!(kind("0000:01:00.0"), DeviceKind::SwitchUpstreamPort);
    assert_eq!(kind("0000:02:01.0"), DeviceKind::SwitchDownstreamPort);
    assert_eq!(kind("0000:08:00.0"), DeviceKind::SwitchUpstreamPort);
    assert_eq!(kind("0000:09:00.0"), DeviceKind::SwitchDownstreamPort);
    let gpu2 = index(&topology, "0000:0a:00.0");
    assert_eq!(topology.devices[gpu2].depth, 5);
    let chain: Vec<String> =
        std::iter::successors(topology.parent(gpu2), |&up| topology.parent(up))
            .map(|up| topology.devices[up].bdf.to_string())
            .collect();
    assert_eq!(
        chain,
        [
            "0000:09:00.0",
            "0000:08:00.0",
            "0000:02:01.0",
            "0000:01:00.0",
            "0000:00:01.0"
        ]
    );
    let gpus: Vec<String> = topology
        .gpus()
        .iter()
        .map(|&gpu| topology.devices[gpu].bdf.to_string())
        .collect();
    assert_eq!(gpus, DGX_GPUS);
    let gpu0 = &topology.devices[index(&topology, "0000:05:00.0")];
    assert_eq!(gpu0.driver.as_deref(), Some("nvidia"));
    assert_eq!(gpu0.numa_node, Some(0));
    assert_eq!(gpu0.local_cpulist.as_deref(), Some("0-31,64-95"));
    assert_eq!(gpu0.iommu_group, Some(12));
    assert_eq!(gpu0.config_bytes_readable, 4096);
    // The host bridge function is root complex integrated: no link.
    assert!(topology
        .link_above(index(&topology, "0000:00:00.0"))
        .is_none());
    // Inside a switch there is no physical link.
    assert!(topology
        .link_above(index(&topology, "0000:02:00.0"))
        .is_none());
}

#[test]
fn dgx8_links_from_config_space() {
    let topology = probe("dgx8");
    // As root the link registers are read from config space (the
    // unprivileged test covers the attribute formats).
    let nvme = topology
        .link_above(index(&topology, "0000:0c:00.0"))
        .unwrap();
    assert_eq!(
        (
            nvme.current_speed,
            nvme.current_width,
            nvme.max_speed,
            nvme.max_width
        ),
        (
            Some(LinkSpeed::Gt16),
            Some(4),
            Some(LinkSpeed::Gt16),
            Some(4)
        )
    );
    assert_eq!(nvme.state, LinkState::Full);
    assert_eq!(nvme.upstream, Some(index(&topology, "0000:02:02.0")));
    // Target speed only comes from LnkCtl2 of the port above.
    assert_eq!(nvme.target_speed, Some(LinkSpeed::Gt16));
    let gpu0 = topology
        .link_above(index(&topology, "0000:05:00.0"))
        .unwrap();
    assert!((gpu0.current_bandwidth_gbps().unwrap() - 16.0 * GEN4_LANE).abs() < 1e-9);
}

#[test]
fn dgx8_degraded_link_is_reported() {
    let topology = probe("dgx8");
    let switch = index(&topology, "0000:08:00.0");
    let link = topology.link_above(switch).unwrap();
    assert_eq!(link.state, LinkState::Degraded);
    assert_eq!((link.current_width, link.max_width), (Some(8), Some(16)));
    let degraded: Vec<usize> = (0..topology.links.len())
        .filter(|&link| topology.links[link].state == LinkState::Degraded)
        .map(|link| topology.links[link].downstream)
        .collect();
    assert_eq!(degraded, [switch]);

    let report = ProbeReport::new(&topology, &CostModel::default());
    let findings: Vec<_> = report
        .findings
        .iter()
        .filter(|finding| finding.kind == FindingKind::DegradedLink)
        .collect();
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0].severity, Severity::Error);
    assert_eq!(findings[0].device, Some(bdf("0000:08:00.0")));
    assert!(
        findings[0]
            .evidence
            .contains("current 16.0 GT/s x8, capable 16.0 GT/s x16"),
        "{}",
        findings[0].evidence
    );
    assert!(
        findings[0].evidence.contains("LnkSta@0x72=0x0084"),
        "{}",
        findings[0].evidence
    );
    assert_eq!(report.worst_severity(), Some(Severity::Error));

    // GPU2 and GPU3 sit behind it.
    for gpu in [2, 3] {
        let to_root = report.gpus[gpu].bottleneck_to_root.as_ref().unwrap();
        assert_eq!(to_root.link_above, bdf("0000:08:00.0"));
        assert!((to_root.bandwidth_gbps - 8.0 * GEN4_LANE).abs() < 1e-9);
    }
}

#[test]
fn dgx8_idle_gpu_link_is_not_called_degraded() {
    let topology = probe("dgx8");
    let link = topology
        .link_above(index(&topology, "0000:8b:00.0"))
        .unwrap();
    assert_eq!(link.state, LinkState::IdleDownshiftLikely);
    assert_eq!(link.current_speed, Some(LinkSpeed::Gt2_5));
    assert!((link.current_bandwidth_gbps().unwrap() - 4.0).abs() < 1e-9);
    assert!((link.effective_bandwidth_gbps().unwrap() - 16.0 * GEN4_LANE).abs() < 1e-9);
    let report = ProbeReport::new(&topology, &CostModel::default());
    let idle: Vec<_> = report
        .findings
        .iter()
        .filter(|finding| finding.kind == FindingKind::IdleDownshiftLikely)
        .collect();
    assert_eq!(idle.len(), 1);
    assert_eq!(
        (idle[0].severity, idle[0].device),
        (Severity::Info, Some(bdf("0000:8b:00.0")))
    );
}

#[test]
fn dgx8_sub_healthy_gpu_is_reported() {
    let topology = probe("dgx8");
    let gpu6 = index(&topology, "0000:8a:00.0");
    let device = &topology.devices[gpu6];
    assert_eq!(device.aer.correctable.as_ref().unwrap().total, 90_000);
    assert_eq!(device.aer.nonfatal.as_ref().unwrap().total, 3);
    assert_eq!(device.aer.fatal.as_ref().unwrap().total, 0);
    assert!((device.health.unwrap() - 0.91 * 0.9997).abs() < 1e-12);
    let sub_healthy: Vec<usize> = (0..topology.devices.len())
        .filter(|&d| topology.is_sub_healthy(d))
        .collect();
    assert_eq!(sub_healthy, [gpu6]);
    // The link above it carries the lower score of its two ends.
    assert!((topology.link_above(gpu6).unwrap().health.unwrap() - 0.91 * 0.9997).abs() < 1e-12);
    let root_port = &topology.devices[index(&topology, "0000:80:01.0")];
    assert_eq!(root_port.aer.rootport_total_correctable, Some(12));

    let report = ProbeReport::new(&topology, &CostModel::default());
    assert!(report.gpus[6].sub_healthy);
    let findings: Vec<_> = report
        .findings
        .iter()
        .filter(|finding| finding.kind == FindingKind::SubHealthy)
        .collect();
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0].device, Some(bdf("0000:8a:00.0")));
    assert!(
        findings[0].evidence.contains("TOTAL_ERR_COR=90000"),
        "{}",
        findings[0].evidence
    );
    assert!(
        findings[0].evidence.contains("RxErr 80000"),
        "{}",
        findings[0].evidence
    );

    // A laxer model makes it healthy again.
    let lax = HealthModel {
        sub_healthy_below: 0.9,
        ..HealthModel::default()
    };
    let topology = Topology::from_sysfs_root(&generator::fixture_root("dgx8"), lax).unwrap();
    assert!(!topology.is_sub_healthy(gpu6));
}

#[test]
fn dgx8_acs_redirect_on_one_switch_is_found() {
    let topology = probe("dgx8");
    let report = ProbeReport::new(&topology, &CostModel::default());
    let ports: Vec<Option<Bdf>> = report
        .findings
        .iter()
        .filter(|finding| finding.kind == FindingKind::AcsRedirect)
        .map(|finding| finding.device)
        .collect();
    assert_eq!(
        ports,
        [Some(bdf("0000:84:00.0")), Some(bdf("0000:84:01.0"))]
    );
    let finding = report
        .findings
        .iter()
        .find(|finding| finding.kind == FindingKind::AcsRedirect)
        .unwrap();
    assert_eq!(finding.severity, Severity::Warning);
    assert!(
        finding.evidence.contains("ACS Control @0x14e=0x001d"),
        "{}",
        finding.evidence
    );
    assert!(
        finding.evidence.contains("ReqRedir+ CmpltRedir+"),
        "{}",
        finding.evidence
    );
    assert!(
        finding.evidence.contains("0000:85:00.0-0000:86:00.0"),
        "{}",
        finding.evidence
    );
    assert!(finding
        .action
        .contains("pci=disable_acs_redir=0000:84:00.0"));

    let pair = |a: usize, b: usize| {
        report
            .gpu_pairs
            .iter()
            .find(|pair| (pair.a, pair.b) == (a, b))
            .unwrap()
    };
    assert_eq!(pair(4, 5).p2p_route, PeerRoute::AcsRedirected);
    assert_eq!(
        pair(4, 5).acs_redirecting_ports,
        [bdf("0000:84:00.0"), bdf("0000:84:01.0")]
    );
    assert_eq!(pair(0, 1).p2p_route, PeerRoute::Switch);
    assert_eq!(pair(6, 7).p2p_route, PeerRoute::Switch);
    assert_eq!(pair(0, 4).p2p_route, PeerRoute::RootComplex);
    // Redirected traffic also climbs the switch's upstream links: modelled
    // as PHB over the links up to the root port.
    assert!(pair(4, 5).model_bandwidth_gbps < pair(6, 7).model_bandwidth_gbps);
}

#[test]
fn dgx8_pair_classes_hops_and_bottlenecks() {
    let topology = probe("dgx8");
    let gpu = |n: usize| index(&topology, DGX_GPUS[n]);
    let path = |a: usize, b: usize| topology.path_between(gpu(a), gpu(b));
    let cases = [
        (0, 1, PathClass::Pix, 2, "0000:05:00.0", 16.0),
        (2, 3, PathClass::Pix, 2, "0000:0a:00.0", 16.0),
        (0, 2, PathClass::Pxb, 4, "0000:08:00.0", 8.0),
        (4, 7, PathClass::Pxb, 4, "0000:85:00.0", 16.0),
        (0, 4, PathClass::Sys, 6, "0000:05:00.0", 16.0),
        (3, 6, PathClass::Sys, 6, "0000:08:00.0", 8.0),
    ];
    for (a, b, class, hops, bottleneck, lanes) in cases {
        let found = path(a, b);
        assert_eq!(found.class, class, "GPU{a}-GPU{b}");
        assert_eq!(found.hops(), hops, "GPU{a}-GPU{b}");
        let (link, bandwidth) = found.bottleneck.unwrap();
        assert_eq!(
            topology.devices[topology.links[link].downstream].bdf,
            bdf(bottleneck),
            "GPU{a}-GPU{b}"
        );
        assert!(
            (bandwidth - lanes * GEN4_LANE).abs() < 1e-9,
            "GPU{a}-GPU{b}"
        );
        assert_eq!(found.unknown_links, 0);
    }
    // The idle GPU7 counts at its full speed.
    assert!((path(6, 7).bottleneck.unwrap().1 - 16.0 * GEN4_LANE).abs() < 1e-9);
    // GPU6 is on the path: its health is the path's.
    assert!((path(6, 7).health.unwrap() - 0.91 * 0.9997).abs() < 1e-12);
    assert_eq!(path(0, 1).health, Some(1.0));
    // The two ports of the NIC's switch and the host bridge path.
    let nvme = index(&topology, "0000:0c:00.0");
    assert_eq!(topology.path_between(gpu(0), nvme).class, PathClass::Pxb);
    let host_function = index(&topology, "0000:00:00.0");
    assert_eq!(
        topology.path_between(gpu(0), host_function).class,
        PathClass::Phb
    );
}

#[test]
fn dgx8_small_bar_and_iommu_groups() {
    let topology = probe("dgx8");
    let gpu1 = &topology.devices[index(&topology, "0000:06:00.0")];
    let rebar = gpu1.resizable_bars.as_ref().unwrap();
    assert_eq!(rebar.entries[0].bar_index, 1);
    assert_eq!(rebar.entries[0].current_size_bytes, 256 << 20);
    assert_eq!(rebar.entries[0].max_supported_bytes(), Some(64 << 30));
    let bar1 = gpu1
        .bars
        .as_ref()
        .unwrap()
        .iter()
        .find(|bar| bar.index == 1)
        .unwrap();
    assert_eq!(bar1.size_bytes, 256 << 20);
    assert!(bar1.prefetchable && bar1.is_64bit);
    let report = ProbeReport::new(&topology, &CostModel::default());
    let small: Vec<_> = report
        .findings
        .iter()
        .filter(|finding| finding.kind == FindingKind::SmallBar)
        .collect();
    assert_eq!(small.len(), 1);
    assert_eq!(small[0].device, Some(bdf("0000:06:00.0")));
    assert!(
        small[0]
            .evidence
            .contains("BAR1 is 256 MiB but supports up to 64 GiB"),
        "{}",
        small[0].evidence
    );
    let groups: Vec<Option<Bdf>> = report
        .findings
        .iter()
        .filter(|finding| finding.kind == FindingKind::IommuGroupShared)
        .map(|finding| finding.device)
        .collect();
    assert_eq!(
        groups,
        [Some(bdf("0000:05:00.0")), Some(bdf("0000:85:00.0"))]
    );
}

/// Ring edges (both directions) with one end in `group` and the other outside.
fn crossings(order: &[usize], group: &[usize]) -> usize {
    (0..order.len())
        .filter(|&i| group.contains(&order[i]) != group.contains(&order[(i + 1) % order.len()]))
        .count()
}

#[test]
fn dgx8_ring_enters_slow_paths_once() {
    let topology = probe("dgx8");
    let report = ProbeReport::new(&topology, &CostModel::default());
    let best = report.ring.best.as_ref().unwrap();
    assert_eq!(best.method, RingMethod::Exact);
    let mut members = best.order.clone();
    members.sort_unstable();
    assert_eq!(members, (0..8).collect::<Vec<_>>());
    // Behind the degraded link: in once, out once.
    assert_eq!(crossings(&best.order, &[2, 3]), 2, "{:?}", best.order);
    // Across the sockets: there and back once.
    assert_eq!(crossings(&best.order, &[0, 1, 2, 3]), 2, "{:?}", best.order);
    // No socket crossing starts or ends behind the degraded link or at the sub-healthy GPU6.
    let n = best.order.len();
    for i in 0..n {
        let (from, to) = (best.order[i], best.order[(i + 1) % n]);
        if (from < 4) != (to < 4) {
            for end in [from, to] {
                assert!(
                    ![2, 3, 6].contains(&end),
                    "socket crossing at GPU{end}: {:?}",
                    best.order
                );
            }
        }
    }
    let sys = CostModel::default().cross_numa_factor;
    assert!((best.bottleneck_gbps - 16.0 * GEN4_LANE * sys).abs() < 1e-9);
    // NCCL's bus-id order crosses from GPU3 (behind the x8 link) to GPU4.
    let nccl = report.ring.nccl_default.as_ref().unwrap();
    assert_eq!(nccl.order, (0..8).collect::<Vec<_>>());
    assert!((nccl.bottleneck_gbps - 8.0 * GEN4_LANE * sys).abs() < 1e-9);
    assert!(best.total_cost_us < nccl.total_cost_us);
    assert_eq!(best.order_bdf[0], bdf(DGX_GPUS[0]));
}

#[test]
fn dgx8_json_validates_against_the_schema() {
    let topology = probe("dgx8");
    validate_against_schema(&ProbeReport::new(&topology, &CostModel::default()));
}

#[test]
fn this_machine_virtio_without_links() {
    let topology = probe("this-machine-virtio");
    let names: Vec<String> = topology
        .devices
        .iter()
        .map(|device| device.bdf.to_string())
        .collect();
    assert_eq!(
        names,
        [
            "0000:00:00.0",
            "0000:00:01.0",
            "0000:00:02.0",
            "0000:00:03.0",
            "0000:00:04.0",
            "0000:00:05.0"
        ]
    );
    assert_eq!(topology.host_bridges.len(), 1);
    assert_eq!(topology.host_bridges[0].name, "pci0000:00");
    assert_eq!(topology.host_bridges[0].numa_node, None);
    assert!(topology.links.is_empty());
    assert!(topology.gpus().is_empty());
    for (index, device) in topology.devices.iter().enumerate() {
        assert_eq!(device.kind, DeviceKind::Endpoint);
        assert_eq!(
            device.upstream,
            pcieipc::probe::topology::Upstream::HostBridge(0)
        );
        assert_eq!(device.link_end, Default::default(), "{}", device.bdf);
        assert!(device.pci_express.is_none());
        assert!(device.health.is_none());
        assert!(topology.link_above(index).is_none());
    }
    let net = &topology.devices[3];
    assert_eq!(
        (net.vendor_id, net.device_id, net.class_code),
        (Some(0x1af4), Some(0x1041), Some(0x020000))
    );
    assert_eq!(net.driver.as_deref(), Some("virtio-pci"));
    assert_eq!(net.config_bytes_readable, 256);
    assert_eq!(net.local_cpulist.as_deref(), Some("0-1"));
    assert_eq!(net.bars.as_ref().unwrap()[0].size_bytes, 512 << 10);

    let report = ProbeReport::new(&topology, &CostModel::default());
    let kinds: Vec<FindingKind> = report.findings.iter().map(|finding| finding.kind).collect();
    assert_eq!(kinds, [FindingKind::NoGpus]);
    assert_eq!(report.worst_severity(), Some(Severity::Info));
    assert!(report.ring.best.is_none() && report.ring.nccl_default.is_none());
    validate_against_schema(&report);
}

#[test]
fn gpu_in_an_x8_slot_is_narrow_not_degraded() {
    let mut devices = generator::dgx_eight_gpu();
    for device in devices
        .iter_mut()
        .filter(|device| ["0000:05:00.0", "0000:04:00.0"].contains(&device.bdf.as_str()))
    {
        let link = device.link.as_mut().unwrap();
        link.max_width = 8;
        link.current_width = 8;
    }
    let scratch = generator::ScratchDir::new("x8-slot").unwrap();
    let root = scratch.path.join("root");
    generator::write_tree(&root, &devices, 4096).unwrap();
    let topology = Topology::from_sysfs_root(&root, HealthModel::default()).unwrap();
    let gpu0 = index(&topology, "0000:05:00.0");
    assert_eq!(topology.link_above(gpu0).unwrap().state, LinkState::Full);
    let report = ProbeReport::new(&topology, &CostModel::default());
    let narrow: Vec<_> = report
        .findings
        .iter()
        .filter(|finding| finding.kind == FindingKind::NarrowLink)
        .collect();
    assert_eq!(narrow.len(), 1);
    assert_eq!(
        (narrow[0].severity, narrow[0].device),
        (Severity::Warning, Some(bdf("0000:05:00.0")))
    );
    assert!(
        narrow[0]
            .evidence
            .contains("current 16.0 GT/s x8, capable 16.0 GT/s x8"),
        "{}",
        narrow[0].evidence
    );
}

/// The engine's chunk policy fed from the probe: each GPU's path to its host
/// bridge as link facts. GPU2 sits behind the x8 uplink (Gen4, so not the
/// policy's degraded Gen3 x8 rule), GPU6 is sub-healthy (AER errors: 256 KiB
/// chunks), GPU7 is idle at 2.5 GT/s but retrains to 16 under load (so not
/// Gen2's 64 KiB).
#[test]
fn link_facts_for_the_chunk_policy_come_from_the_probe() {
    use pcieipc::engine::{ChunkPolicy, LinkFacts};
    let topology = probe("dgx8");
    let facts = |text: &str| LinkFacts::of_device(&topology, index(&topology, text)).unwrap();
    let summary = |facts: LinkFacts| (facts.speed_gt_s, facts.width, facts.recent_aer_errors);
    assert_eq!(summary(facts("0000:05:00.0")), (16.0, 16, 0));
    assert_eq!(summary(facts("0000:0a:00.0")), (16.0, 8, 0));
    assert_eq!(summary(facts("0000:8a:00.0")), (16.0, 16, 1));
    assert_eq!(summary(facts("0000:8b:00.0")), (16.0, 16, 0));
    let policy = ChunkPolicy::default();
    let chunk = |text: &str| policy.chunk_bytes(Some(&facts(text)), 64 << 20);
    assert_eq!(chunk("0000:05:00.0"), 1 << 20);
    assert_eq!(chunk("0000:0a:00.0"), 1 << 20);
    assert_eq!(chunk("0000:8a:00.0"), 256 << 10);
    assert_eq!(chunk("0000:8b:00.0"), 1 << 20);
    // A host bridge has no link above it.
    assert!(LinkFacts::of_device(&topology, index(&topology, "0000:00:00.0")).is_none());
}

/// 32 GT/s lane after 128b/130b, in GB/s.
const GEN5_LANE: f64 = 32.0 * 128.0 / 130.0 / 8.0;

/// A fixture's sysfs tree with the NVML answers recorded next to it.
fn probe_with_nvml(name: &str) -> Topology {
    use pcieipc::probe::{NvlinkSource, Nvlinks, NvmlFixture};
    let root = generator::fixture_root(name);
    let answers = NvmlFixture::new(&root.join("nvml.json")).answers().unwrap();
    Topology::from_sysfs_root(&root, HealthModel::default())
        .unwrap()
        .with_nvlinks(Nvlinks::from_answers(&answers))
}

/// The real capture of the one-H200 VM: the GPU on the root bus with no
/// port above it, no AER files, NVML answering NOT_SUPPORTED for NVLink.
#[test]
fn h200_vm_gpu_link_comes_from_the_gpu_itself() {
    use pcieipc::probe::{HealthBasis, NvlinkStatus};
    let topology = probe_with_nvml("h200-1gpu-vm");
    assert_eq!(
        topology
            .gpus()
            .iter()
            .map(|&gpu| topology.devices[gpu].bdf)
            .collect::<Vec<_>>(),
        [bdf("0000:00:06.0")]
    );
    let gpu = index(&topology, "0000:00:06.0");
    let link = topology.link_above(gpu).unwrap();
    assert_eq!(link.upstream, None);
    assert_eq!(
        (
            link.current_speed,
            link.current_width,
            link.max_speed,
            link.max_width
        ),
        (
            Some(LinkSpeed::Gt32),
            Some(16),
            Some(LinkSpeed::Gt32),
            Some(16)
        )
    );
    assert_eq!(link.state, LinkState::Full);
    // Only the GPU reports a link: the host bridge and virtio functions do not.
    assert_eq!(topology.links.len(), 1);
    assert!(!topology.aer_reported());
    assert_eq!(topology.devices[gpu].health, Some(1.0));
    assert_eq!(topology.health_basis(gpu), Some(HealthBasis::LinkState));
    assert_eq!(
        topology.health_basis(index(&topology, "0000:00:03.0")),
        None
    );
    assert_eq!(topology.nvlinks.status, NvlinkStatus::NotSupported);
    assert_eq!(
        topology.nvlinks.driver_version.as_deref(),
        Some("580.159.04")
    );

    let report = ProbeReport::new(&topology, &CostModel::default());
    let to_root = report.gpus[0].bottleneck_to_root.as_ref().unwrap();
    assert_eq!(to_root.link_above, bdf("0000:00:06.0"));
    assert!((to_root.bandwidth_gbps - 16.0 * GEN5_LANE).abs() < 1e-9);
    assert_eq!(report.gpus[0].unknown_links_to_root, 0);
    assert_eq!(report.gpus[0].health_basis, Some(HealthBasis::LinkState));
    assert!(!report.aer_reported);
    assert_eq!(report.nvlink.summary, "not supported by this GPU/driver");
    assert_eq!(
        report.gpus[0].nvlink,
        Some(pcieipc::probe::nvlink::GpuNvlinkState::NotSupported)
    );
    assert!(report.findings.is_empty(), "{:?}", report.findings);
    validate_against_schema(&report);
}

/// The constructed two-H200 VM: both GPUs on the root bus at Gen5 x16,
/// joined by 18 NVLink 4 links.
#[test]
fn h200_pair_over_nvlink_is_nv18_and_the_ring_runs_at_its_bandwidth() {
    let topology = probe_with_nvml("h200-2gpu-vm");
    let (gpu0, gpu1) = (
        index(&topology, "0000:00:06.0"),
        index(&topology, "0000:00:07.0"),
    );
    let path = topology.path_between(gpu0, gpu1);
    assert_eq!(path.class, PathClass::Phb);
    assert_eq!(path.hops(), 2);
    let nvlink = path.nvlink.unwrap();
    assert_eq!(nvlink.label(), "NV18");
    assert!(!nvlink.through_switch);
    assert_eq!(nvlink.bandwidth_gbps, Some(18.0 * 25.0));

    let report = ProbeReport::new(&topology, &CostModel::default());
    let pair = &report.gpu_pairs[0];
    assert_eq!(
        (pair.class.as_str(), pair.pcie_class),
        ("NV18", PathClass::Phb)
    );
    assert_eq!(pair.model_bandwidth_gbps, 450.0);
    // The PCIe path is still reported: both GPUs' own Gen5 x16 links.
    assert!((pair.bottleneck.as_ref().unwrap().bandwidth_gbps - 16.0 * GEN5_LANE).abs() < 1e-9);
    let best = report.ring.best.as_ref().unwrap();
    assert_eq!(best.bottleneck_gbps, 450.0);
    assert_eq!(
        report.ring.nccl_default.as_ref().unwrap().bottleneck_gbps,
        450.0
    );
    validate_against_schema(&report);

    // Without NVML's answers the pair is PCIe through the root complex, at
    // the GPUs' real link bandwidth rather than the unknown-link default.
    let pcie_only = Topology::from_sysfs_root(
        &generator::fixture_root("h200-2gpu-vm"),
        HealthModel::default(),
    )
    .unwrap();
    let report = ProbeReport::new(&pcie_only, &CostModel::default());
    assert_eq!(report.gpu_pairs[0].class, "PHB");
    assert!(report.gpu_pairs[0].nvlink.is_none());
    let phb = CostModel::default().host_bridge_factor;
    let best = report.ring.best.as_ref().unwrap();
    assert!((best.bottleneck_gbps - 16.0 * GEN5_LANE * phb).abs() < 1e-9);
    validate_against_schema(&report);
}

/// NVML answers of a DGX H100/H200: each GPU's 18 NVLink 4 links go to the
/// NVSwitches (which nvidia-smi prints as NV18 for every pair).
fn dgx8_nvswitch_answers() -> pcieipc::probe::NvmlAnswers {
    use pcieipc::probe::nvlink::{Answer, NvmlGpuAnswers, NvmlLinkAnswers};
    let switches = [
        "0000:c5:00.0",
        "0000:c6:00.0",
        "0000:c7:00.0",
        "0000:c8:00.0",
    ];
    pcieipc::probe::NvmlAnswers {
        driver_version: Answer::Ok("580.159.04".to_string()),
        nvml_version: Answer::Ok("13.580.159.04".to_string()),
        gpus: DGX_GPUS
            .iter()
            .enumerate()
            .map(|(gpu, bus_id)| NvmlGpuAnswers {
                index: gpu as u32,
                name: Answer::Ok("NVIDIA H200".to_string()),
                pci_bus_id: Answer::Ok(format!("0000{bus_id}")),
                links: (0..18)
                    .map(|link| NvmlLinkAnswers {
                        link,
                        state: Answer::Ok(true),
                        version: Answer::Ok(6),
                        remote_pci_bus_id: Answer::Ok(switches[link as usize % 4].to_string()),
                        remote_device_type: Answer::Ok(2),
                        error_counters: Vec::new(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

#[test]
fn dgx8_over_nvswitches_every_pair_is_nv18() {
    use pcieipc::engine::{ChunkPolicy, LinkFacts};
    use pcieipc::probe::Nvlinks;
    let topology = probe("dgx8").with_nvlinks(Nvlinks::from_answers(&dgx8_nvswitch_answers()));
    let report = ProbeReport::new(&topology, &CostModel::default());
    assert_eq!(report.gpu_pairs.len(), 28);
    for pair in &report.gpu_pairs {
        assert_eq!(pair.class, "NV18", "GPU{}-GPU{}", pair.a, pair.b);
        let nvlink = pair.nvlink.unwrap();
        assert!(nvlink.through_switch);
        assert_eq!(nvlink.bandwidth_gbps, Some(450.0));
    }
    // The PCIe classes stay as they were (ACS redirect included).
    assert_eq!(report.gpu_pairs[0].pcie_class, PathClass::Pix);
    let best = report.ring.best.as_ref().unwrap();
    assert_eq!(best.bottleneck_gbps, 450.0);
    // The degraded x8 uplink, the sub-healthy GPU6 and the socket crossing
    // no longer limit the ring: NCCL's bus-id order is as good.
    assert_eq!(
        report.ring.nccl_default.as_ref().unwrap().bottleneck_gbps,
        450.0
    );
    validate_against_schema(&report);

    // The chunk policy: GPU6's PCIe path is sub-healthy (256 KiB), but its
    // ring traffic leaves over NVLink.
    let facts = LinkFacts::of_device(&topology, index(&topology, "0000:8a:00.0")).unwrap();
    assert!(facts.over_nvlink);
    assert_eq!(facts.recent_aer_errors, 1);
    assert_eq!(
        ChunkPolicy::default().chunk_bytes(Some(&facts), 64 << 20),
        1 << 20
    );
}

/// A machine without AER counters: a degraded link's health is the share of
/// its expected bandwidth, said to rest on link state, and reported as a
/// degraded link rather than as AER errors.
#[test]
fn without_aer_health_comes_from_link_state() {
    use pcieipc::probe::HealthBasis;
    let mut devices = generator::dgx_eight_gpu();
    for device in &mut devices {
        device.aer = None;
        device.rootport_errors = None;
    }
    let scratch = generator::ScratchDir::new("no-aer").unwrap();
    let root = scratch.path.join("root");
    generator::write_tree(&root, &devices, 4096).unwrap();
    let topology = Topology::from_sysfs_root(&root, HealthModel::default()).unwrap();
    assert!(!topology.aer_reported());
    // The switch behind the x8 uplink: half its expected bandwidth.
    let switch = index(&topology, "0000:08:00.0");
    assert_eq!(topology.devices[switch].health, Some(0.5));
    assert_eq!(topology.health_basis(switch), Some(HealthBasis::LinkState));
    let gpu2 = index(&topology, "0000:0a:00.0");
    assert_eq!(topology.devices[gpu2].health, Some(1.0));
    // GPU6 had AER errors in the fixture; without counters its link is full.
    assert_eq!(
        topology.devices[index(&topology, "0000:8a:00.0")].health,
        Some(1.0)
    );
    // The idle GPU7 is not penalised.
    assert_eq!(
        topology.devices[index(&topology, "0000:8b:00.0")].health,
        Some(1.0)
    );
    // Ports without a link above have no score.
    assert_eq!(
        topology.devices[index(&topology, "0000:00:01.0")].health,
        None
    );

    let report = ProbeReport::new(&topology, &CostModel::default());
    assert!(!report.aer_reported);
    let kinds: Vec<FindingKind> = report.findings.iter().map(|finding| finding.kind).collect();
    assert!(kinds.contains(&FindingKind::DegradedLink), "{kinds:?}");
    assert!(!kinds.contains(&FindingKind::SubHealthy), "{kinds:?}");
    validate_against_schema(&report);
}

#[test]
fn dgx8_degraded_link_says_whether_pcieipc_may_retrain_it() {
    let mut topology = probe("dgx8");
    let switch = index(&topology, "0000:08:00.0");
    let verdict = |topology: &Topology| {
        let link = topology.link_above(switch).unwrap();
        retrainability(topology, link, topology.link_control.as_deref())
    };
    // The fixture has no module parameters: the module is not loaded.
    assert_eq!(topology.link_control, None);
    let unloaded = verdict(&topology);
    assert!(!unloaded.retrainable);
    assert_eq!(unloaded.reason, "pcieipc.ko is not loaded");
    assert_eq!(
        unloaded.allow.as_deref(),
        Some("insmod pcieipc.ko link_control=0000:08:00.0")
    );

    topology.link_control = Some(vec![bdf("0000:07:00.0")]);
    let unlisted = verdict(&topology);
    assert!(!unlisted.retrainable);
    assert!(
        unlisted
            .reason
            .contains("root has not listed it in link_control"),
        "{}",
        unlisted.reason
    );
    assert!(
        unlisted
            .allow
            .as_deref()
            .is_some_and(|allow| allow.starts_with("pcieipc link allow 0000:08:00.0 ")),
        "{:?}",
        unlisted.allow
    );
    let report = ProbeReport::new(&topology, &CostModel::default());
    let finding = report
        .findings
        .iter()
        .find(|finding| finding.kind == FindingKind::DegradedLink)
        .unwrap();
    assert!(
        finding
            .action
            .contains("to allow it: pcieipc link allow 0000:08:00.0"),
        "{}",
        finding.action
    );
    validate_against_schema(&report);

    // Listed, and nothing but GPUs, NICs and switch ports below: allowed.
    topology.link_control = Some(vec![bdf("0000:08:00.0")]);
    let listed = verdict(&topology);
    assert!(listed.retrainable, "{}", listed.reason);
    assert_eq!(listed.reason, "root listed 0000:08:00.0 in link_control");

    // A drive anywhere below the port (here a function two levels down made
    // an NVMe controller): refused, listed or not, naming the drive.
    let below_switch = topology.devices[switch].children[0];
    let drive = topology.devices[below_switch].children[0];
    let drive_bdf = topology.devices[drive].bdf;
    topology.devices[drive].class_code = Some(0x010802);
    let storage = verdict(&topology);
    assert!(!storage.retrainable);
    assert_eq!(storage.allow, None);
    assert!(
        storage.reason.starts_with(&format!(
            "mass-storage function {drive_bdf} hangs from port"
        )),
        "{}",
        storage.reason
    );

    // A device the module binds below the port: retrainable, listed or not.
    topology.link_control = Some(vec![]);
    topology.devices[switch].driver = Some("pcieipc".to_string());
    assert!(verdict(&topology).retrainable);
}
